"""Shared bits of the environment tests."""

from pathlib import Path

TINY_CHAT = str(Path(__file__).resolve().parents[2] / "deps" / "models" / "tiny-chat")
"""The tiny model's directory (= envrl.model.tiny.DEFAULT_DIR, without importing torch)."""
