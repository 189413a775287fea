"""Build the GPU kit: one folder (<= 64 MiB) with the wheels a bare GPU image lacks for the checks.

    uv run --no-sync python -m scripts.gpu.build_kit            # -> outputs/gpu-kit/ (git-ignored)

Guarantee: the folder holds exactly `PACKAGES` as cp312 manylinux x86_64 (or pure-Python) wheels
at the versions installed here (so the GPU runs the code tested here), plus `kit.json` naming
them; the build fails, naming the package, if a wheel cannot be had or the folder passes
`MAX_BYTES`. A bare image is one with torch and transformers (and their own dependencies:
numpy, huggingface_hub, tokenizers, safetensors, ...) but not envrl's: what the trainer and
the bench import beyond those is listed here, found by importing them and reading which
distributions the new modules came from.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KIT_DIR = ROOT / "outputs" / "gpu-kit"
PACKAGES = (
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "typing-extensions",
    "loguru",
    "msgpack",
    "tomli-w",
)
"""What `scripts.bench.trainer_throughput` and `scripts.gpu.parity` import beyond torch,
transformers and their dependencies (envrl itself travels as source: `src/` is put on the path).
typing-extensions is torch's too, but pydantic needs a newer one than old images carry."""
MAX_BYTES = 64 * 2**20
PLATFORM = (
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--abi",
    "cp312",
    "--platform",
    "manylinux2014_x86_64",
)


def pip() -> list[str]:
    """A pip to download with: this interpreter's, else `pip3` / `pip` on PATH (a uv venv has none)."""
    for command in ([sys.executable, "-m", "pip"], [shutil.which("pip3")], [shutil.which("pip")]):
        if command[0] and subprocess.run([*command, "--version"], capture_output=True).returncode == 0:
            return command
    raise SystemExit("build_kit: no pip found (this interpreter's, pip3 or pip on PATH); install one")


def build(target: Path) -> dict[str, str]:
    pins = {name: importlib.metadata.version(name) for name in PACKAGES}
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for name, version in pins.items():
        command = [*pip(), "download", "--quiet", "--no-deps", "--only-binary=:all:", *PLATFORM, "-d", str(target)]
        done = subprocess.run([*command, f"{name}=={version}"], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(
                f"build_kit: no cp312 manylinux x86_64 wheel of {name}=={version}: {done.stderr.strip()[-400:]}"
            )
    size = sum(f.stat().st_size for f in target.iterdir())
    if size > MAX_BYTES:
        raise SystemExit(f"build_kit: {target} is {size / 2**20:.1f} MiB, over {MAX_BYTES / 2**20:.0f} MiB")
    (target / "kit.json").write_text(json.dumps({"python": "cp312", "packages": pins}, indent=1) + "\n")
    print(
        f"wrote {len(pins)} wheels to {target} ({size / 2**20:.1f} MiB): "
        + ", ".join(f"{k}=={v}" for k, v in pins.items())
    )
    return pins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=Path, default=KIT_DIR, help=f"the kit folder (default {KIT_DIR.relative_to(ROOT)})"
    )
    build(parser.parse_args().out)


if __name__ == "__main__":
    main()
