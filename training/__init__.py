"""Stage 3: DeepSpeed pretraining (data loading, engine, checkpoints, monitoring)."""
