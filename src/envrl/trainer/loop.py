"""The training loop: step n trains on `rollouts/step_<n>/` and publishes `weights/step_<n+1>/`, or stops the run
with an error naming the step and batch; a non-finite loss or gradient never reaches the weights."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from loguru import logger

from envrl.data.layout import (
    checkpoint_dir,
    checkpoints_root,
    final_weights_dir,
    ledger_file,
    metrics_file,
    weights_dir,
)
from envrl.runtime.atomic import write_failure
from envrl.telemetry.ledger import Ledger
from envrl.telemetry.metrics import MetricsSink
from envrl.trainer.checkpoint import Checkpoints
from envrl.trainer.config import TrainerConfig
from envrl.trainer.learner import Learner, TrainingError
from envrl.trainer.parallel import Runtime
from envrl.trainer.weights import publish_final, weight_publisher
from envrl.transport.batches import BatchReceiver, BatchTimeout, FileBatchReceiver
from envrl.transport.memory import TransferError

if TYPE_CHECKING:
    from envrl.transport.weights import WeightPublisher


class StopRequested(BaseException):
    """SIGTERM while the trainer waited for a batch: the step has not started and is abandoned
    (a BaseException, so no `except Exception` on the way swallows it)."""


class TrainerStopped(Exception):
    """The trainer stopped on SIGTERM before `max_steps`, its last trained step checkpointed."""


class Trainer:
    """One run's steps: each waits for its batch, trains the `Learner` on it, publishes the next
    policy and, when due, a checkpoint; `run()` trains until `max_steps`."""

    def __init__(self, config: TrainerConfig, runtime: Runtime) -> None:
        self.config = config
        self.runtime = runtime
        self.learner = Learner(config, runtime)
        self.checkpoints = Checkpoints(config.output_dir, config.ckpt, config.max_steps, self.learner, runtime)
        self.batches: BatchReceiver = FileBatchReceiver(config.output_dir, timeout_s=config.batch_timeout_s)
        self.publisher: WeightPublisher = weight_publisher(
            config.weights,
            config.output_dir,
            self.learner.tokenizer,
            runtime,
            self.learner.base_config,
            config.ckpt.interval,
        )
        self.ledger = Ledger(ledger_file(config.output_dir, "trainer") if runtime.is_main else None, "trainer")
        """The main rank's wait / compute / publish / checkpoint spans."""
        self.metrics: MetricsSink | None = None
        self._stop = False
        """SIGTERM arrived: the step in flight finishes, then a checkpoint of it is written."""
        self._waiting = False
        """Waiting for a batch: SIGTERM ends the wait (`StopRequested`)."""

    def start_step(self) -> int:
        """Load the checkpoint asked for (if any) and return the first step to train."""
        config = self.config
        step = config.ckpt.resume_step
        if step is None and config.resume:
            step = self.checkpoints.latest()
            if step is None:
                logger.warning(
                    f"--resume: no checkpoint under {checkpoints_root(config.output_dir)} (ckpt.interval = {config.ckpt.interval}); "
                    "training again from the initial model on the published batches from step 0"
                )
                return 0
        if step is None:
            return 0
        self.checkpoints.load(step)
        return step

    def run(self) -> None:
        config = self.config
        start = self.start_step()
        if self.runtime.is_main:
            self.metrics = MetricsSink(
                metrics_file(config.output_dir),
                config.wandb,
                process="trainer",
                output_dir=config.output_dir,
                config=config.model_dump(mode="json"),
                resume_step=start if config.resume else None,
            )
        restore = self._catch_sigterm()
        try:
            done = start
            for step in range(start, config.max_steps):
                try:
                    self.run_step(step)
                except StopRequested:
                    break
                done = step + 1
                if self._stop:
                    break
            if self._stop and done < config.max_steps:
                self._stopped(start, done)
        finally:
            restore()
            self.publisher.close()
            if self.metrics is not None:
                self.metrics.close()
            self.ledger.close()

    def _catch_sigterm(self) -> Callable[[], None]:
        """Turn SIGTERM into a stop after the step in flight (main thread only); returns what puts
        the handler it replaced back."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def stop(signum: int, frame: object) -> None:
            self._stop = True  # no logging here: the main thread may hold the logger's lock
            if self._waiting:
                raise StopRequested

        previous = signal.signal(signal.SIGTERM, stop)
        return lambda: signal.signal(signal.SIGTERM, previous)  # type: ignore[arg-type]

    def _stopped(self, start: int, done: int) -> None:
        """After SIGTERM: checkpoint the `done` steps trained (unless written already or checkpoints
        are off), then raise `TrainerStopped`."""
        target = checkpoint_dir(self.config.output_dir, done)
        where = "no new checkpoint (ckpt.interval = 0, or no step trained)"
        if done > start and self.config.ckpt.interval:
            if not self.checkpoints.due(done):  # else written with the step
                with self.ledger.span("checkpoint", done - 1), self._writing(done - 1, target):
                    self.checkpoints.save(done)
            where = f"checkpoint {target}"
        raise TrainerStopped(
            f"stopped by SIGTERM after {done} of {self.config.max_steps} steps; {where}; --resume continues"
        )

    def run_step(self, step: int) -> dict[str, float]:
        """Wait for batch `step`, receive it, train on it, publish the next policy, checkpoint when due."""
        ledger = self.ledger
        with ledger.span("wait_batch", step):
            self._waiting = not self._stop
            try:
                waited = self.batches.wait(step)
            except BatchTimeout as e:
                raise TrainingError(str(e)) from None
            finally:
                self._waiting = False
        with ledger.span("read_batch", step):
            samples = self.batches.receive(step)
        with ledger.span("compute", step):
            stats = self.learner.train_on(step, samples, where=self.batches.where(step))
        start = time.perf_counter()
        with ledger.span("publish", step):
            self._publish(step)
        if self.checkpoints.due(step + 1):
            with ledger.span("checkpoint", step), self._writing(step, checkpoint_dir(self.config.output_dir, step + 1)):
                self.checkpoints.save(step + 1)
        stats.update(wait_time_s=waited, publish_time_s=time.perf_counter() - start)
        with ledger.span("log", step):  # the span is written with the next step's (or at close)
            self._log(step, stats)
        return stats

    def _publish(self, step: int) -> None:
        """The policy after `step`; after the last step also the run's final weights, loadable for good."""
        done, output_dir = step + 1, self.config.output_dir
        last = done == self.config.max_steps
        with self._writing(step, weights_dir(output_dir, done)):
            self.publisher.publish(self.learner.model, done, last=last)
        if last:
            with self._writing(step, final_weights_dir(output_dir)):
                published = weights_dir(output_dir, done)
                publish_final(
                    self.config.model.name, published, final_weights_dir(output_dir), self.runtime, self.learner.lora
                )

    @contextmanager
    def _writing(self, step: int, target: Path) -> Iterator[None]:
        """A failure to write `target` stops the run naming the step: a broken broadcast of an
        earlier policy, or a full disk (OSError, or RuntimeError out of torch's writers)."""
        try:
            yield
        except TransferError as e:
            raise TrainingError(f"step {step}: {e}") from e
        except Exception as e:
            raise TrainingError(f"step {step}: {write_failure(target, e)}") from e

    def _log(self, step: int, stats: dict[str, float]) -> None:
        if self.metrics is not None:
            self.metrics.log(step, {f"trainer/{k}": v for k, v in stats.items()})
        logger.info(
            f"step {step}: loss {stats['loss']:.4g}, entropy {stats['entropy']:.3f}, "
            f"mismatch_kl {stats['mismatch_kl']:.2e}, grad_norm {stats['grad_norm']:.3g}, "
            f"{stats['tokens_per_s']:.0f} tok/s, {stats['step_time_s']:.2f}s"
        )
        self.ledger.flush()
