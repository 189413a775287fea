"""How batches (orchestrator -> trainer) and policies (trainer -> every replica) travel: one seam each
(`batches.py`, `weights.py`), each transport holding both its ends."""
