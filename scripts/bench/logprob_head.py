"""Peak memory (or time) of the logits path: full `[tokens, vocab]` logits vs the chunked `LogprobHead`.

    MALLOC_MMAP_THRESHOLD_=65536 uv run --no-sync python -m scripts.bench.logprob_head
    uv run --no-sync python -m scripts.bench.logprob_head --time --tokens 1024   # ms per forward + backward

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
    from envrl.trainer.loss import token_logprobs
    from envrl.trainer.model.head import ScoreRequest, chunked_token_scores

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


def timed(tokens: int, vocab: int, hidden: int, reps: int) -> None:
    """Median ms of forward + backward per path: full logits, the chunked head with eager kernels
    and, where this tree has them, with compiled ones (compiled once before timing)."""
    import statistics
    import time

    import envrl.trainer.model.head as head
    from envrl.trainer.loss import token_logprobs

    torch.manual_seed(0)
    h = torch.randn(tokens, hidden, requires_grad=True)
    w = (torch.randn(vocab, hidden) / hidden**0.5).requires_grad_()
    request = head.ScoreRequest(torch.randint(0, vocab, (tokens,)), torch.ones(tokens))
    paths = {
        "full": lambda: token_logprobs(h @ w.t(), request.input_ids, request.temperature),
        "chunked": lambda: head.chunked_token_scores(h, w, request),
    }
    if hasattr(head, "compiled_kernels"):
        kernels = head.compiled_kernels()
        paths["chunked, compiled"] = lambda: head.chunked_token_scores(h, w, request, kernels=kernels)
    for name, run in paths.items():
        times = []
        for _ in range(reps + 1):
            start = time.perf_counter()
            logprobs, _ = run()
            logprobs.sum().backward()
            times.append(time.perf_counter() - start)
        print(
            f"{name}: {statistics.median(times[1:]) * 1e3:.0f} ms forward + backward (median of {reps}; {tokens} tokens x {vocab} x {hidden}, fp32, {torch.get_num_threads()} threads)",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--path", choices=["full", "chunked"])
    parser.add_argument("--time", action="store_true", help="time forward + backward instead of peak memory")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if args.time:
        return timed(args.tokens, args.vocab, args.hidden, args.reps)
    if args.path:
        return one(args.path, args.tokens, args.vocab, args.hidden)
    for path in ("full", "chunked"):
        shape = ["--tokens", str(args.tokens), "--vocab", str(args.vocab), "--hidden", str(args.hidden)]
        subprocess.run([sys.executable, "-m", "scripts.bench.logprob_head", "--path", path, *shape], check=True)


if __name__ == "__main__":
    main()
