"""Shared bits of the environment tests."""

from pathlib import Path

TINY_CHAT_DIR = Path(__file__).resolve().parents[2] / "deps" / "models" / "tiny-chat"
"""The tiny model the repo ships (`python -m envrl.model.tiny`, seed 0, from the checkout's root)."""
TINY_CHAT = str(TINY_CHAT_DIR)
