"""Stage 4: fine-tune a checkpoint on GLUE, NER and SQuAD and score it."""
