"""LoRA in the trainer, in-process on the tiny model: what trains, what is published, the
reference with the adapter off, resume, the final merged export, and the one-line errors."""

import json

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader
from transformers import AutoModelForCausalLM

from envrl.config import ConfigError, resolve_config
from envrl.trainer.config import TrainerConfig
from envrl.trainer.model.lora import LoraError, check_lora_model
from tests.support.run_files import metric_lines, write_batches
from tests.support.samples import synthetic_samples
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR
from tests.support.trainers import make_trainer, tensor_names

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj", "lm_head"]}
"""lm_head included: the tiny model ties it to the input embeddings, the case that needs care."""


def adapter_tensors(directory) -> dict[str, torch.Tensor]:
    return load_file(directory / "adapter_model.safetensors")


def test_only_the_adapter_trains_and_each_step_publishes_only_the_adapter(tmp_path):
    write_batches(tmp_path, 2)
    trainer = make_trainer(tmp_path, max_steps=2, lora=LORA, **{"loss.clip": False})
    base = {n: p.detach().clone() for n, p in trainer.learner.model.named_parameters() if not p.requires_grad}
    trainer.run()
    published = tmp_path / "weights" / "step_2"
    assert sorted(p.name for p in published.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    tensors = adapter_tensors(published)
    assert tensors and all(".lora_A." in name or ".lora_B." in name for name in tensors)
    assert any(".lora_B." in name and tensor.abs().max() > 0 for name, tensor in tensors.items())
    config = json.loads((published / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], sorted(config["target_modules"])) == (
        4,
        8.0,
        sorted(LORA["target_modules"]),
    )
    frozen = dict(trainer.learner.model.named_parameters())
    assert all(torch.equal(frozen[name], before) for name, before in base.items())


def test_step_zero_policy_is_the_base_model(tmp_path):
    trainer = make_trainer(tmp_path, lora=LORA)
    ids = torch.tensor([[1, 17, 42, 99, 7]])
    base = AutoModelForCausalLM.from_pretrained(DEFAULT_DIR, dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(trainer.learner.model(input_ids=ids).logits, base(input_ids=ids).logits)


def test_the_lora_reference_is_the_base_with_the_adapter_off_not_a_copy(tmp_path):
    trainer = make_trainer(tmp_path, lora=LORA, **{"loss.clip": False, "loss.ref_kl_coef": 0.1})
    assert trainer.learner.reference is None
    samples = synthetic_samples(6, seed=4)
    first, second = (trainer.learner.train_on(0, samples, where="fixed")["ref_kl"] for _ in range(2))
    assert first == 0.0 and second > 0.0


def test_lora_resume_continues_bit_for_bit(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    for out in (straight, interrupted):
        write_batches(out, 3)
    make_trainer(straight, max_steps=3, lora=LORA).run()
    make_trainer(interrupted, max_steps=2, lora=LORA, **{"ckpt.interval": 1}).run()
    saved = FileSystemReader(interrupted / "checkpoints" / "step_2").read_metadata().state_dict_metadata
    weights = [key for key in saved if key.startswith("model.")]
    assert weights and all(".lora_A." in key or ".lora_B." in key for key in weights)  # the adapter, not the base
    make_trainer(interrupted, max_steps=3, lora=LORA, resume=True).run()
    want, got = metric_lines(straight)[2], metric_lines(interrupted)[2]
    assert (got["trainer/loss"], got["trainer/grad_norm"]) == (want["trainer/loss"], want["trainer/grad_norm"])
    final_straight = adapter_tensors(straight / "weights" / "step_3")
    final_resumed = adapter_tensors(interrupted / "weights" / "step_3")
    assert all(torch.equal(final_straight[name], final_resumed[name]) for name in final_straight)


def test_the_final_policy_is_a_merged_hf_model_that_computes_what_the_adapter_does(tmp_path):
    write_batches(tmp_path, 1)
    trainer = make_trainer(tmp_path, max_steps=1, lora=LORA)
    trainer.run()
    final = tmp_path / "weights" / "final"
    assert tensor_names(final) == sorted([*tensor_names(DEFAULT_DIR), "lm_head.weight"])  # the adapted head, untied
    merged = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(DEFAULT_DIR, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, tmp_path / "weights" / "step_1").eval()
    ids = torch.tensor([[1, 17, 42, 99, 7, 300, 301]])
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted(input_ids=ids).logits, rtol=0, atol=1e-5)
    assert (final / "tokenizer.json").is_file()


def test_the_final_full_policy_is_the_last_step_hard_linked(tmp_path):
    write_batches(tmp_path, 1)
    make_trainer(tmp_path, max_steps=1).run()
    final, last = tmp_path / "weights" / "final", tmp_path / "weights" / "step_1"
    assert sorted(p.name for p in final.iterdir()) == sorted(p.name for p in last.iterdir())
    assert (final / "model.safetensors").samefile(last / "model.safetensors")


def test_an_unknown_target_module_names_the_modules_the_model_has(tmp_path):
    with pytest.raises(LoraError) as error:
        make_trainer(tmp_path, lora={**LORA, "target_modules": ["q_proj", "qkv_proj"]})
    message = str(error.value)
    assert (
        "'qkv_proj'" in message and "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj" in message
    )
    assert "\n" not in message
    with pytest.raises(LoraError, match="'c_attn'"):  # the same check, before any weight is loaded
        check_lora_model(TrainerConfig.model_validate({"lora": {"target_modules": ["c_attn"]}}).lora, str(DEFAULT_DIR))


@pytest.mark.parametrize(
    ("lora", "key"),
    [
        ({"rank": 0}, "rank"),
        ({"alpha": 0}, "alpha"),
        ({"dropout": 1.0}, "dropout"),
        ({"target_modules": []}, "target_modules"),
    ],
)
def test_bad_lora_values_are_config_errors_naming_the_key(lora, key):
    with pytest.raises(ConfigError, match=f"trainer.lora.{key}|lora.{key}"):
        resolve_config(TrainerConfig, base={"lora": lora})
