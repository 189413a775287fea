"""The orchestrator loop, wiring only: batch n holds `batch_size` rollouts of policies >= n - max_async_level, and
every dispatched group is trained, excluded, stale or saved pending, once; publishing batch n commits step n."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from functools import partial

from loguru import logger

from envrl.data.layout import metrics_file, rollouts_root
from envrl.envclient.curve import sidecar_keys
from envrl.envclient.handles import EnvHandle, TrainEnvs
from envrl.envclient.plan import PlannedEnv, env_plan
from envrl.envclient.sidecars import Sidecars
from envrl.model.client import ClientConfig
from envrl.model.replicas import InferenceReplicas
from envrl.orchestrator.batch import BatchBuilder
from envrl.orchestrator.checks import StepChecks
from envrl.orchestrator.config import OrchestratorConfig
from envrl.orchestrator.distill import Distiller
from envrl.orchestrator.policy import PolicyTracker
from envrl.orchestrator.retention import prune_batches
from envrl.orchestrator.rollout_files import append_group
from envrl.orchestrator.scheduler import BatchShape, Scheduler
from envrl.orchestrator.state import OrchestratorState, publish_step, resumed_state
from envrl.orchestrator.step_report import StepReport
from envrl.orchestrator.train_evals import TrainEvals
from envrl.orchestrator.watchdog import StallWatchdog, loop_status
from envrl.runtime.lifeline import parent_pid
from envrl.telemetry.console import fmt_shares
from envrl.telemetry.ledger import Ledger
from envrl.telemetry.metrics import MetricsSink
from envrl.transport.batches import BatchSender, FileBatchSender
from envrl.transport.weights import ReplicaPolicyLoader


def orchestrator_envs(config: OrchestratorConfig, client: ClientConfig | None = None) -> list[PlannedEnv]:
    """The orchestrator's envs (`env_plan`): train envs, then eval tables, on `client` (default: the
    run's train client) where an env has no client of its own; a server it spawns binds a free
    loopback port and admits only the sidecars' key (made by `Sidecars` in `<output_dir>/curve/`)."""
    run_client = client or config.train_client()
    return env_plan(
        config.train_envs, config.eval_envs(), run_client, config.restarts, curve=sidecar_keys(config.output_dir)
    )


def inference_replicas(config: OrchestratorConfig) -> InferenceReplicas:
    """The client of the run's inference replicas, with the reload token from the environment."""
    return InferenceReplicas(
        config.inference.base_urls,
        model=config.model.name,
        retry=config.inference.retry,
        reload_token=os.environ.get(config.inference.reload_token_env),
        reload_in_flight="recompute" if config.partial_rollouts else "wait",
    )


class Orchestrator:
    """Wires the run: inference client, metrics, envs, policy tracker and scheduler, all built
    here (after reading the resumed state) and released by `close()`."""

    def __init__(self, config: OrchestratorConfig, envs: list[PlannedEnv] | None = None) -> None:
        """`envs`: the plan of its envs (default `orchestrator_envs(config)`, what `orchestrator --dry-run` prints)."""
        self.config, self.output_dir = config, config.output_dir
        resumed = resumed_state(config.output_dir, config.resume)
        self.start_step = 0 if resumed is None else resumed.step + 1
        self.counters: Counter[str] = Counter(resumed.counters if resumed else {})
        """`counters/...` metrics; rollouts dispatched, retried (by the envs), requeued, ..."""
        self.inference = inference_replicas(config)
        self.metrics = MetricsSink(
            metrics_file(self.output_dir),
            config.wandb,
            process="orchestrator",
            output_dir=self.output_dir,
            config=config.model_dump(mode="json"),
            resume_step=self.start_step if config.resume else None,
        )
        self.ledger = Ledger.of(self.output_dir, "orchestrator")
        self.batches: BatchSender = FileBatchSender(self.output_dir)
        self.sidecars = Sidecars(self.output_dir, config.restarts, ready_timeout=config.env_ready_timeout_s)
        planned = orchestrator_envs(config) if envs is None else envs
        self.train_envs = self._train_envs(planned, resumed)
        self.evals = self._evals(planned)
        self.policy = PolicyTracker(
            ReplicaPolicyLoader(self.inference, self.output_dir, config.weights_timeout_s),
            max_async_level=config.max_async_level,
            timeout=config.weights_timeout_s,
            keep=config.keep_weights,
            keep_every=config.keep_weights_every,
            ledger=self.ledger,
        )
        self.scheduler = Scheduler(
            self.train_envs,
            BatchShape.of(config),
            seed=config.seed,
            counters=self.counters,
            ledger=self.ledger,
            dispatched=resumed.dispatched if resumed else 0,
            requeued=resumed.pending if resumed else (),
            partial_rollouts=config.partial_rollouts,
            refill_rollouts=config.refill_rollouts,
        )
        self.checks = StepChecks(config.checks, self.train_envs.envs, self.metrics)
        self.watchdog = self._watchdog()
        self.batch = BatchBuilder(config, self.counters)
        self.distill = Distiller(config.distill, self.metrics) if config.distill else None
        self.report = StepReport(self.metrics, self.output_dir, config.max_steps, self.counters)

    def _train_envs(self, planned: list[PlannedEnv], resumed: OrchestratorState | None) -> TrainEnvs:
        """The train envs of the plan, drawing tasks from where the resumed state left them."""
        config = self.config
        train = [
            EnvHandle.of(env, self.sidecars, config.sampling, self.counters) for env in planned if env.split == "train"
        ]
        return TrainEnvs(train, config.seed, positions=resumed.positions if resumed else None)

    def _evals(self, planned: list[PlannedEnv]) -> TrainEvals:
        """The interval and final evals on the plan's eval envs."""
        config = self.config
        return TrainEvals(
            [EnvHandle.of(env, self.sidecars, config.sampling) for env in planned if env.split == "eval"],
            config.eval,
            seed=config.seed,
            max_inflight=config.inflight_limit,
            output_dir=self.output_dir,
            sink=self.metrics,
        )

    def _watchdog(self) -> StallWatchdog:
        """The stall watchdog over the scheduler and the policy tracker (`checks.stall_*`)."""
        checks = self.config.checks
        return StallWatchdog(
            output_dir=self.output_dir,
            factor=checks.stall_factor,
            min_s=checks.stall_min_s,
            strict=checks.strict,
            describe=partial(loop_status, self.scheduler, self.policy),
            stacks_root=parent_pid(),
            sink=self.metrics,
        )

    async def run(self) -> None:
        """Start, publish a batch per step, evaluate the final policy, and always close."""
        config = self.config
        try:
            with self.ledger.span("start", self.start_step):
                await self._start()
            self.watchdog.start()
            for step in range(self.start_step, config.max_steps):
                await self._step(step)
            self.watchdog.stop()
            await self.evals.at_end(config.max_steps, self.policy)
            logger.success(
                f"wrote batches for steps {self.start_step}..{config.max_steps - 1} to {rollouts_root(self.output_dir)}"
            )
        except asyncio.CancelledError:
            if (stalled := self.watchdog.stopped_the_run()) is None:
                raise
            raise stalled from None
        finally:
            self.watchdog.stop()
            await self.close()

    @property
    def _envs(self) -> list[EnvHandle]:
        return [*self.train_envs.envs, *self.evals.envs]

    async def _start(self) -> None:
        logger.info(f"waiting for the inference server at {self.config.inference.base_url}")
        await self.inference.wait_until_ready(self.config.inference.ready_timeout_s)
        await self.policy.start_from(self.config.model.name)
        if self.distill is not None:
            await self.distill.start(self.config.inference.base_urls[0], self.config.model.name)
        await asyncio.gather(*(env.start() for env in self._envs))
        logger.info(f"target env shares: {fmt_shares(self.train_envs.shares())}")

    async def close(self) -> None:
        """Cancel what is in flight, stop the env servers, release the clients and the metrics."""
        await self.scheduler.close()
        await self.evals.close()
        await asyncio.gather(*(env.shutdown() for env in self._envs), return_exceptions=True)
        await self.sidecars.close()
        await self.inference.aclose()
        if self.distill is not None:
            await self.distill.aclose()
        self.metrics.close()
        self.ledger.close()

    async def _step(self, step: int) -> None:
        """Serve a policy within the async bound, start due evals, collect the step's groups, record
        the stale ones, turn the rest into the published batch, then let the checks see the step."""
        self.evals.raise_failure()
        started = time.monotonic()
        with self.ledger.span("step", step):
            await self.policy.ensure(step)
            stale = self.scheduler.drop_stale(step)
            self.evals.start_due(step, self.policy.current)
            with self.ledger.span("wait_rollouts", step):
                groups = await self.scheduler.collect(step, self.policy.current)
            stale += self.scheduler.drop_stale(step)  # arrived too old while collecting: this step's too
            record = partial(append_group, self.output_dir, step, counters=self.counters)  # a group's rollout lines
            for group in stale:
                record(group)
            with self.ledger.span("batching", step):  # samples (each group recorded first), metrics, publish
                with self.ledger.span("samples", step):
                    samples = self.batch.samples(groups, record)
                if self.distill is not None:
                    with self.ledger.span("teacher", step):
                        samples = await self.distill.apply(step, samples)
                with self.ledger.span("metrics", step):
                    self.report.log(
                        step,
                        groups,
                        stale,
                        samples,
                        time.monotonic() - started,
                        seq_counts=self.batch.seq_counts,
                        policy=self.policy,
                        inflight=self.scheduler.inflight_rollouts,
                    )
                with self.ledger.span("publish_batch", step):
                    state = OrchestratorState(
                        step=step,
                        positions=self.train_envs.positions,
                        dispatched=self.scheduler.dispatched,
                        counters=dict(self.counters),
                        pending=self.scheduler.pending(),
                    )
                    publish_step(self.batches, self.output_dir, samples, state)
            self.watchdog.step_finished(step, time.monotonic() - started)
            self.checks.after_step(step, [(group.env.name, group.traces) for group in groups])
            if self.config.batch_retention == "checkpoints":
                prune_batches(self.output_dir)
        self.ledger.flush()
