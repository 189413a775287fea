"""The inference server (vLLM + weight reload) and its token-in/token-out client."""
