"""The training loop in-process on the tiny model: learning, hand-off, resume, and failures."""

import json
import math
from itertools import pairwise

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from envrl.data.layout import batch_dir
from envrl.data.samples import BATCH_FILE, BatchError, TrainingSample, write_batch
from envrl.trainer.checkpoint import Checkpoints, list_checkpoints
from envrl.trainer.config import CheckpointConfig, OptimConfig
from envrl.trainer.learner import TrainingError, lr_factor
from envrl.trainer.weights import publish_weights
from tests.support.run_files import metric_lines, write_batches
from tests.support.samples import synthetic_samples
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR
from tests.support.trainers import make_trainer, tensor_names


def test_loss_goes_down_on_a_fixed_batch(tmp_path):
    trainer = make_trainer(tmp_path, **{"loss.clip": False})
    samples = synthetic_samples(6, seed=4)
    losses = [trainer.learner.train_on(0, samples, where="fixed")["loss"] for _ in range(5)]
    assert all(later < earlier for earlier, later in pairwise(losses)), losses


def test_the_reference_kl_starts_at_zero_and_grows_as_the_policy_moves(tmp_path):
    """The reference is the initial model: identical weights and inputs give identical logits on
    one process, so the first step's KL is exactly 0; after an update it is positive."""
    trainer = make_trainer(tmp_path, **{"loss.clip": False, "loss.ref_kl_coef": 0.1})
    samples = synthetic_samples(6, seed=4)
    first, second = (trainer.learner.train_on(0, samples, where="fixed")["ref_kl"] for _ in range(2))
    assert first == 0.0 and second > 0.0
    assert not any(p.requires_grad for p in trainer.learner.reference.parameters())


def test_published_weights_reload_in_transformers_with_the_base_tensor_names(tmp_path):
    write_batches(tmp_path, 1)
    trainer = make_trainer(tmp_path, max_steps=1)
    trainer.run()
    published = tmp_path / "weights" / "step_1"
    assert tensor_names(published) == tensor_names(DEFAULT_DIR)
    reloaded = AutoModelForCausalLM.from_pretrained(published, dtype=torch.float32)
    trained = trainer.learner.model.state_dict()
    assert all(torch.equal(tensor, trained[name]) for name, tensor in reloaded.state_dict().items())
    assert not torch.equal(
        reloaded.model.norm.weight, load_file(DEFAULT_DIR / "model.safetensors")["model.norm.weight"]
    )
    assert (
        AutoTokenizer.from_pretrained(published).chat_template
        == AutoTokenizer.from_pretrained(DEFAULT_DIR).chat_template
    )
    assert not list((tmp_path / "weights").glob(".*"))  # no temp dirs left behind


def test_resume_continues_bit_for_bit(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    for out in (straight, interrupted):
        write_batches(out, 2)
    make_trainer(straight, max_steps=2).run()
    make_trainer(interrupted, max_steps=1, **{"ckpt.interval": 1}).run()  # Adam's moments are set by then
    make_trainer(interrupted, max_steps=2, resume=True).run()
    assert [m["step"] for m in metric_lines(interrupted)] == [0, 1]
    want, got = metric_lines(straight)[1], metric_lines(interrupted)[1]
    assert (got["trainer/loss"], got["trainer/grad_norm"]) == (want["trainer/loss"], want["trainer/grad_norm"])
    final_straight = load_file(straight / "weights" / "step_2" / "model.safetensors")
    final_resumed = load_file(interrupted / "weights" / "step_2" / "model.safetensors")
    assert all(torch.equal(final_straight[name], final_resumed[name]) for name in final_straight)


def test_checkpoints_keep_only_the_newest(tmp_path):
    write_batches(tmp_path, 3)
    make_trainer(tmp_path, max_steps=3, **{"ckpt.interval": 1, "ckpt.keep": 2}).run()
    assert list_checkpoints(tmp_path) == [2, 3]
    assert not list((tmp_path / "checkpoints").glob(".*"))


def test_a_checkpoint_is_due_on_its_interval_and_after_the_last_step(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=7, **{"ckpt.interval": 3})
    assert [step for step in range(1, 8) if trainer.checkpoints.due(step)] == [3, 6, 7]
    never = Checkpoints(tmp_path, CheckpointConfig(interval=0), 7, trainer.learner, trainer.runtime)
    assert not any(never.due(step) for step in range(1, 8))


def test_resume_step_that_does_not_exist_names_what_does(tmp_path):
    write_batches(tmp_path, 1)
    make_trainer(tmp_path, max_steps=1, **{"ckpt.interval": 1}).run()
    with pytest.raises(FileNotFoundError, match=r"checkpoints/step_5 .*steps: \[1\]"):
        make_trainer(tmp_path, max_steps=6, **{"ckpt.resume_step": 5}).start_step()


def test_nan_loss_stops_the_run_naming_the_step_before_the_optimizer_step(tmp_path):
    write_batches(tmp_path, 1)
    samples = synthetic_samples(4, policy_step=1)
    samples[1] = TrainingSample(**samples[1].model_dump() | {"advantage": math.nan, "token_advantages": []})
    write_batch(tmp_path, 1, samples)
    trainer = make_trainer(tmp_path, max_steps=2)
    with pytest.raises(TrainingError, match=r"step 1: loss is nan .*rollouts/step_1"):
        trainer.run()
    assert not (tmp_path / "weights" / "step_2").exists()
    assert all(torch.isfinite(p).all() for p in trainer.learner.model.parameters())


def test_corrupt_batch_is_reported_with_its_path(tmp_path):
    write_batches(tmp_path, 1)
    file = batch_dir(tmp_path, 0) / BATCH_FILE
    file.write_bytes(file.read_bytes()[: len(file.read_bytes()) // 2])
    with pytest.raises(BatchError, match=str(file)):
        make_trainer(tmp_path, max_steps=1).run()


def test_missing_batch_times_out_naming_the_directory(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1, batch_timeout_s=0.3)
    with pytest.raises(TrainingError, match=r"no batch at .*rollouts/step_0 after"):
        trainer.run()


def test_samples_older_than_max_async_level_are_refused(tmp_path):
    trainer = make_trainer(tmp_path, max_async_level=1)
    with pytest.raises(TrainingError, match=r"step 3: .*from policy 1, outside \[2, 3\]"):
        trainer.learner.train_on(3, synthetic_samples(2, policy_step=1), where="rollouts/step_3")


def test_step_metrics_cover_the_issue_list(tmp_path):
    write_batches(tmp_path, 1)
    make_trainer(tmp_path, max_steps=1, **{"loss.ratio_mask": [0.5, 2.0]}).run()
    (line,) = metric_lines(tmp_path)
    issue_list = ("loss", "entropy", "mismatch_kl", "clip_frac", "mask_frac", "grad_norm", "tokens_per_s")
    for key in (*issue_list, "step_time_s", "peak_mem_gib"):
        assert math.isfinite(line[f"trainer/{key}"]), key
    assert line["trainer/samples"] == 6 and line["trainer/entropy"] > 0


def test_lr_schedule_warms_up_then_follows_the_cosine():
    optim = OptimConfig(warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
    factors = [lr_factor(step, optim, max_steps=6) for step in range(6)]
    assert factors[:3] == [0.5, 1.0, 1.0]
    assert factors[4] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(1, OptimConfig(schedule="constant"), max_steps=6) == 1.0


def test_weights_are_published_in_the_base_checkpoint_dtype_without_tied_copies(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.learner.base_config.dtype = torch.bfloat16  # as for a bf16 checkpoint such as Qwen3
    target = tmp_path / "weights" / "step_1"
    assert publish_weights(
        trainer.learner.model, trainer.learner.tokenizer, target, trainer.runtime, trainer.learner.base_config
    )
    assert tensor_names(target) == tensor_names(DEFAULT_DIR)
    assert load_file(target / "model.safetensors")["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert json.loads((target / "config.json").read_text())["dtype"] == "bfloat16"
    assert not publish_weights(
        trainer.learner.model, trainer.learner.tokenizer, target, trainer.runtime, trainer.learner.base_config
    )


def test_activation_checkpointing_gives_the_same_step(tmp_path):
    samples = synthetic_samples(4, seed=5)
    plain = make_trainer(tmp_path / "plain").learner.train_on(0, samples, where="fixed")
    checkpointed = make_trainer(tmp_path / "ac", activation_checkpointing=True)
    assert checkpointed.learner.model.is_gradient_checkpointing
    recomputed = checkpointed.learner.train_on(0, samples, where="fixed")
    assert recomputed["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    assert recomputed["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)
