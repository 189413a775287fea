"""The distillation teacher's server `rl` starts for `teacher_weights`: the run's inference options on the teacher's
weights, its own devices or the inference servers' shared with room for both; anything else a one-line
`ConfigError`."""

from __future__ import annotations

from collections.abc import Sequence

from envrl.config import ConfigError
from envrl.inference.config import InferenceConfig
from envrl.launcher.plan.placement import ROLE_KEYS, Placement
from envrl.orchestrator.config import OrchestratorConfig
from envrl.runtime.net import is_loopback_host
from envrl.runtime.secrets import API_KEY_ENV

SHARED_MEMORY_UTILIZATION = 0.45
"""The most `inference.vllm.gpu_memory_utilization` two vLLM servers on the same devices may each
take: vLLM reserves that share of every device's memory at start-up (0.9 unless set)."""
VLLM_MEMORY_UTILIZATION = 0.9
"""vLLM's own default for `gpu_memory_utilization`."""


def plan_teacher(
    orchestrator: OrchestratorConfig,
    base: InferenceConfig,
    host: str,
    placement: Placement,
    neighbours: Sequence[str],
    job: bool,
) -> tuple[OrchestratorConfig, InferenceConfig | None]:
    """The teacher server for `orchestrator`'s distillation, if it names one by its weights, on
    `host` with the run's inference options `base`, and the orchestrator pointed at it;
    `neighbours` are the other roles (`ROLE_KEYS`) that run on `host`."""
    distill = orchestrator.distill
    if distill is None or distill.teacher_weights is None:
        if placement.teacher_gpus:
            raise ConfigError(
                "placement.teacher.gpus is set but orchestrator.distill.teacher_weights is not: rl starts a teacher "
                "server only for teacher_weights; drop placement.teacher.gpus"
            )
        return orchestrator, None
    _check_devices(base, placement, neighbours, job)
    allow_remote = base.reload.allow_remote or not is_loopback_host(host)  # the run's token guards it
    teacher = base.model_copy(
        update={
            "model": base.model.model_copy(update={"name": distill.teacher_weights}),
            "host": host,
            "port": distill.teacher_port,
            "reload": base.reload.model_copy(update={"allow_remote": allow_remote}),
        }
    )
    served = distill.model_copy(
        update={"teacher_url": teacher.base_url, "teacher_weights": None, "teacher_api_key_env": API_KEY_ENV}
    )
    return orchestrator.model_copy(update={"distill": served}), teacher


def _check_devices(base: InferenceConfig, placement: Placement, neighbours: Sequence[str], job: bool) -> None:
    """The teacher's devices, against the other roles on its host (module docstring)."""
    listed = {"trainer": placement.trainer_gpus, "inference": [g for s in placement.inference_gpus for g in s]}
    gpus = placement.teacher_gpus
    if not gpus:
        if job or any(listed.values()):
            raise ConfigError(
                "orchestrator.distill.teacher_weights: this run places its roles on GPUs (placement.trainer.gpus / "
                "placement.inference.gpus, or a --slurm job), so the teacher's server needs devices too: set "
                "placement.teacher.gpus (its own, or the same list as placement.inference.gpus)"
            )
        return
    unlisted = [ROLE_KEYS[role] for role in neighbours if not listed[role]]
    if unlisted:
        raise ConfigError(
            f"placement.teacher.gpus = {gpus}, but {' and '.join(unlisted)} on the teacher's host is empty, which "
            "means every device of that host, the teacher's too: list that role's devices"
        )
    if placement.teacher_shares_inference and job:
        raise ConfigError(
            f"placement.teacher.gpus = placement.inference.gpus = {gpus} in a --slurm job: its steps start at once, "
            "and a vLLM server sizes its memory from what is free when it starts, so the teacher needs devices of its "
            "own there"
        )
    if placement.teacher_shares_inference:
        share = float(
            base.vllm.get("gpu_memory_utilization", base.vllm.get("gpu-memory-utilization", VLLM_MEMORY_UTILIZATION))
        )
        if share > SHARED_MEMORY_UTILIZATION:
            raise ConfigError(
                f"placement.teacher.gpus = placement.inference.gpus = {gpus}: two vLLM servers on those devices each "
                f"reserve inference.vllm.gpu_memory_utilization = {share:g} of every device's memory; set it to "
                f"{SHARED_MEMORY_UTILIZATION:g} or less, or give the teacher devices of its own"
            )
