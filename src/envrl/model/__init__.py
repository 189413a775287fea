"""The client library of the policy: token-in/token-out calls to the inference replicas, the
train and eval model clients environments use, chat-template rendering and tool-call parsing.
Imported by env workers, the orchestrator and the trainer's SFT mode; never starts vLLM (that is
`envrl.inference`). Beside it, the models built offline (torch needed, imported only to build):
`tiny` (the tiny chat model, `python -m envrl.model.tiny`) and `smollm2` (SmolLM2 from PyPI's
GGUF, or cut down, `python -m envrl.model.smollm2`)."""
