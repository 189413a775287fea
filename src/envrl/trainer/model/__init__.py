"""The trained model's kernels: attention, the log-prob head, loading, recompute, compile and LoRA (docs/trainer.md)."""
