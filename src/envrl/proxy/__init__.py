"""The chat proxy: an OpenAI-compatible endpoint a program outside envrl calls, recorded as Turns (docs/agents.md)."""
