"""How batches (orchestrator -> trainer) and policies (trainer -> every inference replica) travel:
one seam each (`batches.py`, `weights.py`), so the loops say "send batch", "publish weights",
"load policy" and a transport can change behind them (`memory.py`: weights without files)."""

TRANSFER_FILE = "transfer.json"
"""In `weights/step_<k>/`: policy k is sent in memory, and this says from where (envrl.transport.memory)."""
