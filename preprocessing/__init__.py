"""Stage 1 and 2: WordPiece tokenizer and the Beam job that writes pretraining shards."""
