"""Environments written for other frameworks, run unchanged under envrl (docs/adapters.md).

Each adapter imports its framework's package only where it is used: install it in the env's own
venv (`project = "deps/envs/<x>"`), never beside torch and vLLM.
"""
