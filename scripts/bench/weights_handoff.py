"""Seconds per GB of the weight hand-off through a filesystem: safetensors written as the trainer
publishes them (temp dir, fsync, rename) and read back as a reloading inference server reads them.

    uv run --no-sync python -m scripts.bench.weights_handoff [--gb 1] [--dir outputs/bench-weights] [--repeats 3]

Point `--dir` at the shared filesystem a multi-node run would use (docs/scale.md). Before each
read the file's pages are dropped from the page cache (posix_fadvise DONTNEED, no root needed),
so the read comes from the disk or the network filesystem, not from memory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from statistics import median

import torch
from safetensors.torch import load_file, save_file

from envrl.atomic import atomic_dir

TENSOR_BYTES = 64 * 2**20
"""Size of each tensor (an embedding or a large projection of a ~1B model in bf16)."""


def state_dict(gb: float) -> dict[str, torch.Tensor]:
    count = max(1, round(gb * 1e9 / TENSOR_BYTES))
    return {f"layers.{i}.weight": torch.randn(TENSOR_BYTES // 2, dtype=torch.bfloat16) for i in range(count)}


def drop_cached(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--dir", type=Path, default=Path("outputs/bench-weights"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    state = state_dict(args.gb)
    size_gb = sum(t.numel() * t.element_size() for t in state.values()) / 1e9
    writes, reads = [], []
    for repeat in range(args.repeats):
        final = args.dir / f"step_{repeat}"
        shutil.rmtree(final, ignore_errors=True)
        start = time.perf_counter()
        with atomic_dir(final) as tmp:
            save_file(state, tmp / "model.safetensors")
        writes.append(time.perf_counter() - start)
        drop_cached(final / "model.safetensors")
        start = time.perf_counter()
        loaded = load_file(final / "model.safetensors")
        reads.append(time.perf_counter() - start)
        assert loaded.keys() == state.keys()
        shutil.rmtree(final)
    write_s, read_s = median(writes) / size_gb, median(reads) / size_gb
    print(f"{size_gb:.2f} GB x {args.repeats} in {args.dir}: write+fsync+rename {write_s:.2f} s/GB, "
          f"cold read {read_s:.2f} s/GB, hand-off {write_s + read_s:.2f} s/GB (medians)")  # fmt: skip


if __name__ == "__main__":
    main()
