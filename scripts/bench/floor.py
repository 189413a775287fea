"""The single-process floor: plain GRPO on the tiny model in one process, no vLLM, no servers.

    uv run --no-sync python -m scripts.bench.floor [--steps 20] [--prompts 8] [--group 8] [--max-tokens 32]

Each step samples `prompts` tasks of `learnable`, generates `group` completions per prompt with
transformers' `generate` (fp32, temperature 1), scores them with the env's own reward, and takes
one policy-gradient step with group-mean baselines over one padded forward/backward of all
completions. It prints the reward and time of each step and the median step time split into
generation and training: the number envrl's separate processes must match on the same work
(scripts/bench/e2e.py runs both). With `--steps 40 --group 4 --max-tokens 24` it is also the
sanity check that `learnable` is learnable by RL alone.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from statistics import fmean, median

import torch
from transformers import AutoModelForCausalLM

from envrl.envs.registry import load_environment
from envrl.model.chat_tokens import chat_renderer
from tests.support.tiny_chat import TINY_CHAT_DIR as TINY_MODEL


@dataclass
class FloorStep:
    reward: float
    tokens: int
    generation_s: float
    training_s: float

    @property
    def total_s(self) -> float:
        return self.generation_s + self.training_s


def run_floor(
    steps: int, prompts: int, group: int, max_tokens: int, lr: float = 3e-3, seed: int = 0, threads: int = 1
) -> list[FloorStep]:
    """`steps` GRPO steps of the single-process loop; one `FloorStep` each."""
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    rng = random.Random(seed)
    env = load_environment("learnable")
    reward_fn = next(iter(env.rubric.rewards))
    renderer = chat_renderer(str(TINY_MODEL))
    model = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    eos, pad = renderer.eos_id, renderer.tokenizer.pad_token_id
    results = []
    for _ in range(steps):
        t0 = time.perf_counter()
        sequences, prompt_lens, rewards = [], [], []
        for _ in range(prompts):
            task = env.get_task("train", rng.randrange(env.num_tasks("train")))
            prompt = renderer.render(env.prompt(task), None, generation_prompt=True)
            ids = torch.tensor([prompt] * group)
            with torch.no_grad():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    max_new_tokens=max_tokens,
                    eos_token_id=eos,
                    pad_token_id=pad,
                )
            group_rewards = []
            for row in out.tolist():
                completion = row[len(prompt) :]
                if eos in completion:  # what follows the first eos is padding
                    completion = completion[: completion.index(eos) + 1]
                sequences.append(prompt + completion)
                prompt_lens.append(len(prompt))
                group_rewards.append(float(reward_fn(completion=renderer.decode(completion))))
            mean = fmean(group_rewards)
            rewards += [(r, r - mean) for r in group_rewards]
        t1 = time.perf_counter()
        optimizer.zero_grad()
        width = max(map(len, sequences))
        ids = torch.full((len(sequences), width), pad)
        trained = torch.zeros(len(sequences), width)
        for i, (seq, plen) in enumerate(zip(sequences, prompt_lens, strict=True)):
            ids[i, : len(seq)] = torch.tensor(seq)
            trained[i, plen : len(seq)] = 1.0
        attention = (torch.arange(width)[None, :] < torch.tensor([len(s) for s in sequences])[:, None]).long()
        logits = model(ids, attention_mask=attention).logits[:, :-1]
        logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        mask = trained[:, 1:]
        advantages = torch.tensor([a for _, a in rewards])
        loss = -(advantages[:, None] * logprobs * mask).sum() / mask.sum()
        loss.backward()
        optimizer.step()
        t2 = time.perf_counter()
        results.append(FloorStep(fmean(r for r, _ in rewards), int(mask.sum()), t1 - t0, t2 - t1))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    results = run_floor(args.steps, args.prompts, args.group, args.max_tokens, lr=args.lr, threads=args.threads)
    for i, step in enumerate(results):
        print(f"step {i:3d}  reward {step.reward:.3f}  tokens {step.tokens:5d}  {step.total_s:.2f}s", flush=True)
    steady = results[1:] or results
    print(
        f"median step {median(s.total_s for s in steady):.3f}s "
        f"(generation {median(s.generation_s for s in steady):.3f}s, training {median(s.training_s for s in steady):.3f}s); "
        f"reward first-5 {fmean(s.reward for s in results[:5]):.3f} -> last-5 {fmean(s.reward for s in results[-5:]):.3f}"
    )


if __name__ == "__main__":
    main()
