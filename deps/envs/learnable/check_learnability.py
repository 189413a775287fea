"""Sanity check (not part of the package): plain REINFORCE on the tiny random model, no vLLM.

Prints the mean reward per step of `learnable` while a group-baseline policy gradient trains the
randomly initialised tiny model on CPU. Usage (from the repo root):
    .venv/bin/python deps/envs/learnable/check_learnability.py [--steps 40] [--lr 3e-3] ...
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from envrl.envs.chat_tokens import chat_renderer
from envrl.envs.registry import load_environment

DEFAULT_DIR = Path(__file__).resolve().parents[3] / "deps" / "models" / "tiny-chat"
"""The tiny model (scripts/tiny_model.py builds it); a path, as this script runs outside the repo's packages."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    torch.set_num_threads(2)
    env = load_environment("learnable")
    reward_fn = next(iter(env.rubric.rewards))
    renderer = chat_renderer(str(DEFAULT_DIR))
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_DIR, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    eos, pad = renderer.eos_id, renderer.tokenizer.pad_token_id
    history = []
    for step in range(args.steps):
        t0 = time.time()
        optimizer.zero_grad()
        rewards_all, n_tokens = [], 0
        batch = []
        for _ in range(args.tasks_per_step):
            task = env.get_task("train", rng.randrange(env.num_tasks("train")))
            prompt = renderer.render(env.prompt(task), None, generation_prompt=True)
            ids = torch.tensor([prompt] * args.group_size)
            with torch.no_grad():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    max_new_tokens=args.max_tokens,
                    eos_token_id=eos,
                    pad_token_id=pad,
                )
            completions = out[:, len(prompt) :]
            mask = torch.ones_like(completions, dtype=torch.float32)
            for row in range(completions.shape[0]):  # tokens after the first eos are padding
                hits = (completions[row] == eos).nonzero()
                if len(hits):
                    mask[row, hits[0, 0] + 1 :] = 0
            texts = [
                renderer.decode([t for t, m in zip(c.tolist(), mk.tolist(), strict=True) if m])
                for c, mk in zip(completions, mask, strict=True)
            ]
            rewards = torch.tensor([reward_fn(completion=t) for t in texts])
            batch.append((out, len(prompt), mask, rewards - rewards.mean()))
            rewards_all += rewards.tolist()
            n_tokens += int(mask.sum())
        for out, prompt_len, mask, advantages in batch:
            logits = model(out).logits[:, prompt_len - 1 : -1]
            logprobs = torch.log_softmax(logits, -1).gather(-1, out[:, prompt_len:, None]).squeeze(-1)
            loss = -(advantages[:, None] * logprobs * mask).sum() / n_tokens
            loss.backward()
        optimizer.step()
        mean = sum(rewards_all) / len(rewards_all)
        history.append(mean)
        print(f"step {step:3d}  reward {mean:.3f}  tokens {n_tokens}  {time.time() - t0:.1f}s", flush=True)
    first, last = sum(history[:5]) / 5, sum(history[-5:]) / 5
    print(f"first-5 mean {first:.3f}  last-5 mean {last:.3f}  gain {last - first:+.3f}")


if __name__ == "__main__":
    main()
