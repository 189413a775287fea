"""Key combinations of an `rl` run that cannot work (a turn filling the context, a sample past the micro-batch, two
processes on one port of one host, an async loss without off-policy correction), each found before anything starts
and refused (or named) in one line naming the keys."""

from __future__ import annotations

from urllib.parse import urlsplit

from envrl.config import ConfigError
from envrl.inference.config import InferenceConfig
from envrl.orchestrator.config import OrchestratorConfig
from envrl.runtime.net import is_loopback_host
from envrl.trainer.config import TrainerConfig

WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def check_lengths(trainer: TrainerConfig, orchestrator: OrchestratorConfig, inference: InferenceConfig) -> None:
    """Token budgets that cannot work together: a turn longer than the model's context, a
    training sample longer than the trainer's micro-batch budget."""
    context = inference.vllm.get("max_model_len")
    # an eval env's max_tokens is its declaration's unless its table sets one
    tables = [("orchestrator.envs", i, env, env) for i, env in enumerate(orchestrator.envs)]
    tables += [
        ("orchestrator.eval.env", i, table, env)
        for i, (table, env) in enumerate(zip(orchestrator.eval.env, orchestrator.eval_envs(), strict=True))
        if "max_tokens" in table.sampling
    ]
    for key, i, table, env in tables:
        max_tokens = env.sampling_args(orchestrator.sampling).max_tokens
        if isinstance(context, int) and max_tokens >= context:
            where = (
                f"{key}[{i}].sampling.max_tokens"
                if "max_tokens" in table.sampling
                else "orchestrator.sampling.max_tokens"
            )
            raise ConfigError(
                f"{where} = {max_tokens} leaves no room for a prompt in inference.vllm.max_model_len = {context}"
            )
    if orchestrator.seq_len is not None and orchestrator.seq_len > trainer.micro_batch_tokens:
        raise ConfigError(
            f"orchestrator.seq_len = {orchestrator.seq_len} is over trainer.micro_batch_tokens = "
            f"{trainer.micro_batch_tokens}, the tokens of one micro-batch: lower seq_len or raise "
            "trainer.micro_batch_tokens"
        )


def check_no_shared_port(users: list[tuple[str, int, str]]) -> None:
    """Two processes of the run on one port: one would fail to bind, or talk to the wrong server."""
    for i, (host, port, who) in enumerate(users):
        for other_host, other_port, other in users[:i]:
            if port == other_port and _same_host(host, other_host):
                raise ConfigError(
                    f"{other} and {who} would both use port {port}: change env_server_base_port, "
                    "inference.port or the env's address"
                )


def external_ports(orchestrator: OrchestratorConfig) -> list[tuple[str, int, str]]:
    """(host, port, who) of each env server with an `address` of the user's on TCP, once per address."""
    ports, listed = [], set()
    for split, envs in (("train", orchestrator.train_envs), ("eval", orchestrator.eval_envs())):
        for env in envs:
            parts = urlsplit(env.address or "")
            if parts.scheme == "tcp" and parts.port is not None and env.address not in listed:
                listed.add(env.address)
                ports.append((parts.hostname or "", parts.port, f"{split} env {env.resolved_name!r} (its address)"))
    return ports


def _same_host(a: str, b: str) -> bool:
    """Whether binds on `a` and `b` can collide (a wildcard bind takes the port on every interface)."""
    if a in WILDCARD_HOSTS or b in WILDCARD_HOSTS:
        return True
    a, b = a.lower(), b.lower()  # host names are case-insensitive
    return a == b or (is_loopback_host(a) and is_loopback_host(b) and "localhost" in (a, b))


def off_policy_problem(max_async_level: int, clip: object, ratio_mask: object) -> str | None:
    """Why the loss has no off-policy correction for samples up to `max_async_level` steps stale (None: it has)."""
    if max_async_level == 0 or clip is not False or ratio_mask is not None:
        return None
    return (
        f"max_async_level = {max_async_level}: samples may come from policies {max_async_level} step(s) old, but "
        "trainer.loss has no off-policy correction (clip = false and no ratio_mask): their importance ratios are "
        "unbounded; set trainer.loss.clip = [0.2, 0.2] or trainer.loss.ratio_mask = [0.5, 2.0], or max_async_level = 0"
    )
