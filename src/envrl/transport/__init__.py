"""How batches (orchestrator -> trainer) and policies (trainer -> every inference replica) travel:
one seam each (`batches.py`, `weights.py`), so the loops say "send batch", "publish weights",
"load policy" and a transport can change behind them. Each weight transport holds both its ends:
`files.py` (write; check and reload) and `memory.py` (send; receive, over `broadcast.py`'s
collectives and `rendezvous.py`'s proven store); `source.py` reads what a policy directory holds.
"""
