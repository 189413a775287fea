"""`build_model` trains the same way on one CPU process or FSDP2-sharded ranks (fp32 master weights, no rank holding
the whole model); collectives are no-ops without a process group; `PhaseThreads` changes only the thread count."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from loguru import logger
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from envrl.data.layout import batch_dir
from envrl.trainer.config import TrainerConfig
from envrl.trainer.model.attention import resolve_attn_implementation
from envrl.trainer.model.compile import compile_layers, compile_plan
from envrl.trainer.model.head import install_logprob_head
from envrl.trainer.model.loading import load_shards, model_files
from envrl.trainer.model.lora import apply_lora
from envrl.trainer.model.recompute import (
    LayerShape,
    apply_recompute,
    free_memory,
    local_trainable_params,
    plan_recompute,
)


@dataclass(frozen=True)
class Runtime:
    rank: int
    world_size: int
    device: torch.device
    sharded: bool
    """True when parameters are FSDP2-sharded (always on GPU, and with more than one rank)."""
    compute_dtype: torch.dtype

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_runtime(config: TrainerConfig) -> Runtime:
    """Read the torchrun environment (if any), pick the device and start the process group."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    sharded = cuda or world_size > 1
    dtype = {"auto": torch.bfloat16 if cuda else torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16}[
        config.dtype
    ]
    if dtype == torch.bfloat16 and not sharded:
        raise ValueError("trainer.dtype = 'bfloat16' needs a GPU (or torchrun ranks); use 'float32' on one CPU process")
    if sharded and not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(device)
        backend = "nccl" if cuda else "gloo"
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, device_id=device if cuda else None)
        else:  # one GPU without torchrun: a private one-rank group
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(config.seed)
    runtime = Runtime(rank=rank, world_size=world_size, device=device, sharded=sharded, compute_dtype=dtype)
    logger.info(
        f"trainer rank {rank}/{world_size} on {device} (sharded: {sharded}, compute dtype: {dtype}; "
        f"{torch.get_num_threads()} torch threads on cores {sorted(os.sched_getaffinity(0))})"
    )
    return runtime


def running_threads() -> int:
    """Threads runnable on the machine right now, this one included (/proc/loadavg)."""
    return int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])


class PhaseThreads:
    """Torch threads that follow the run's phase on one CPU process (`trainer.phase_threads`):
    the start-up count (OMP_NUM_THREADS: what `rl` leaves the trainer beside vLLM) while the
    orchestrator may still generate or anything else runs, every core the process may use
    while the orchestrator cannot generate and nothing else is runnable.

    The orchestrator cannot generate once it has published the newest batch the async bound
    allows before this step's weights (`rollouts/step_<step + max_async_level>`, or the last
    batch of the run): it then waits for the trainer, and vLLM idles (evals aside). Other work
    on the machine is read from the runnable-thread count: a torch thread sharing a core with
    another process stalls every parallel region (each waits for its slowest thread), which on
    a shared box made a step slower than one thread did (docs/trainer.md). A thread count holds
    for a whole forward or backward pass; `follow` is called before each.
    """

    def __init__(
        self,
        output_dir: Path,
        max_async_level: int,
        max_steps: int,
        idle: int,
        running: Callable[[], int] = running_threads,
    ) -> None:
        self.output_dir = output_dir
        self.max_async_level = max_async_level
        self.max_steps = max_steps
        self.busy = torch.get_num_threads()
        self.idle = idle
        self.running = running

    def follow(self, step: int) -> None:
        """Set the thread count for the next pass of `step`: one `stat` and one /proc read."""
        if self.idle == self.busy:
            return
        newest = min(step + self.max_async_level, self.max_steps - 1)
        # this thread runs; so may our own workers of the last pass, still spinning after it
        alone = self.running() <= torch.get_num_threads()
        threads = self.idle if alone and batch_dir(self.output_dir, newest).is_dir() else self.busy
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)


def phase_threads(config: TrainerConfig, runtime: Runtime) -> PhaseThreads | None:
    """The trainer's `PhaseThreads` on one CPU process with `trainer.phase_threads`, else None."""
    if not config.phase_threads or runtime.device.type != "cpu" or runtime.world_size > 1:
        return None
    idle = len(os.sched_getaffinity(0))  # pinned (`cpus.pin`): only the trainer's own cores
    return PhaseThreads(config.output_dir, config.max_async_level, config.max_steps, idle)


def build_model(config: TrainerConfig, runtime: Runtime) -> nn.Module:
    """The HF model in fp32 (with `trainer.lora`: LoRA adapters on it, the base frozen), placed on
    the runtime's device. One process loads it whole; sharded ranks build it on the meta device
    and read only their own shards from the checkpoint files (`trainer/model/loading.py`)."""
    attn_implementation = resolve_attn_implementation(config.attn_implementation, runtime.device, runtime.compute_dtype)
    if runtime.sharded:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(config.model.name),
                dtype=torch.float32,
                attn_implementation=attn_implementation,
            )
    else:
        model = AutoModelForCausalLM.from_pretrained(
            config.model.name, dtype=torch.float32, attn_implementation=attn_implementation
        )
    logger.info(f"attention: {attn_implementation} (trainer.attn_implementation = {config.attn_implementation!r})")
    model.config.use_cache = False
    if config.lora is not None:
        model = apply_lora(model, config.lora, config.model.name)
    install_logprob_head(model)
    if runtime.sharded:
        load_shards(model, model_files(config.model.name), runtime.device, lambda m: shard_model(m, runtime))
    else:
        model.to(runtime.device)
    model.train()
    recompute = plan_recompute(
        config.activation_checkpointing,
        LayerShape.of(model.config),
        config.micro_batch_tokens,
        runtime.compute_dtype.itemsize,
        free_memory(runtime.device),
        local_trainable_params(model),
    )
    apply_recompute(model, recompute)
    num_params = sum(p.numel() for p in model.parameters())
    compile_layers(model, compile_plan(config.compile, runtime.device, num_params))
    return model


def shard_model(model: nn.Module, runtime: Runtime) -> None:
    """FSDP2 over the ranks: each decoder layer a unit, the rest (embeddings, head) the root's;
    fp32 master weights, compute in the runtime's dtype, gradients reduced in fp32.

    On one rank nothing is sharded, so the compute-dtype copy of the parameters is kept from
    forward to backward (`reshard_after_forward=False`) and, with `hold_gathered`, from one
    micro-batch to the next: the fp32 -> bf16 cast runs once per optimizer step, not twice per
    micro-batch (and the recompute of a checkpointed layer reuses it too)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(runtime.device.type, (runtime.world_size,))
    policy = MixedPrecisionPolicy(param_dtype=runtime.compute_dtype, reduce_dtype=torch.float32)
    reshard = runtime.world_size > 1
    for layer in model.get_decoder().layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)


def hold_gathered(model: nn.Module, runtime: Runtime, more_micro_batches: bool) -> None:
    """On one sharded rank, keep the gathered compute-dtype parameters and accumulate gradients
    unreduced (in fp32: FSDP2 upcasts them to `reduce_dtype`) while `more_micro_batches` of this
    optimizer step follow; release and reduce after the last. The same fp32 sums as reducing
    after each micro-batch (one rank: the reduction is a copy). Several ranks keep FSDP's
    per-micro-batch gather and reduce: holding would give up the sharding's memory."""
    if not runtime.sharded or runtime.world_size > 1 or not hasattr(model, "set_reshard_after_backward"):
        return
    model.set_reshard_after_backward(not more_micro_batches)
    model.set_requires_gradient_sync(not more_micro_batches)


def build_reference(config: TrainerConfig, runtime: Runtime) -> nn.Module:
    """The initial model again, frozen and in eval mode: what a KL to the reference is measured
    against (placed like the trained model, so both see the same micro-batches)."""
    reference = build_model(config, runtime)
    reference.eval()
    reference.requires_grad_(False)
    return reference


def full_state_dict(model: nn.Module, runtime: Runtime) -> dict[str, torch.Tensor]:
    """Unsharded parameters on CPU on rank 0 (empty elsewhere); a collective when sharded."""
    if not runtime.sharded:
        return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def all_reduce_sum(tensor: torch.Tensor, runtime: Runtime) -> torch.Tensor:
    if runtime.sharded:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier(runtime: Runtime) -> None:
    if runtime.sharded:
        dist.barrier()


def shutdown(runtime: Runtime) -> None:
    if runtime.sharded and dist.is_initialized():
        dist.destroy_process_group()
