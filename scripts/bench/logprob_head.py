"""Peak memory of the logits path: full `[tokens, vocab]` logits vs the chunked `LogprobHead`.

    MALLOC_MMAP_THRESHOLD_=65536 uv run --no-sync python -m scripts.bench.logprob_head

Guarantee: each path runs forward and backward in a fresh process on the same random
[tokens, hidden] x [vocab, hidden] fp32 problem; the printed number is the process's peak RSS
above what it held after a warm-up GEMM (CPU: glibc keeps freed buffers below its dynamic
mmap threshold, so without `MALLOC_MMAP_THRESHOLD_` RSS overstates what is held).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys

import torch


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(path: str, tokens: int, vocab: int, hidden: int) -> None:
    from envrl.trainer.head import ScoreRequest, chunked_token_scores
    from envrl.trainer.loss import token_logprobs

    torch.manual_seed(0)
    h = torch.randn(tokens, hidden, requires_grad=True)
    w = (torch.randn(vocab, hidden) / hidden**0.5).requires_grad_()
    request = ScoreRequest(torch.randint(0, vocab, (tokens,)), torch.ones(tokens))
    (torch.randn(64, hidden) @ w.detach().t()).log_softmax(-1).sum()  # allocator and BLAS warm-up
    base = peak_mib()
    if path == "full":
        logprobs, _ = token_logprobs(h @ w.t(), request.input_ids, request.temperature)
    else:
        logprobs, _ = chunked_token_scores(h, w, request)
    logprobs.sum().backward()
    print(
        f"{path}: {peak_mib() - base:.0f} MiB above the inputs ({tokens} tokens x {vocab} vocab x {hidden} hidden, fp32)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--path", choices=["full", "chunked"])
    args = parser.parse_args()
    if args.path:
        return one(args.path, args.tokens, args.vocab, args.hidden)
    for path in ("full", "chunked"):
        shape = ["--tokens", str(args.tokens), "--vocab", str(args.vocab), "--hidden", str(args.hidden)]
        subprocess.run([sys.executable, "-m", "scripts.bench.logprob_head", "--path", path, *shape], check=True)


if __name__ == "__main__":
    main()
