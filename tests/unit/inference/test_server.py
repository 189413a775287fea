"""The inference process's set-up: vLLM flags from engine options, and every vLLM file in the run dir."""

from pathlib import Path

from envrl.inference.config import InferenceConfig
from envrl.inference.server import UNIX_SOCKET_DIR_MAX, link_model_info_cache, option_argv, vllm_environment


def test_engine_options_become_vllm_flags() -> None:
    argv = option_argv({"max_model_len": 512, "enforce_eager": True, "enable_prefix_caching": False,
                        "override_generation_config": {"temperature": 1.0}, "served_model_name": ["a", "b"]})  # fmt: skip
    assert argv == [
        "--max-model-len", "512", "--enforce-eager", "--no-enable-prefix-caching",
        "--override-generation-config", '{"temperature": 1.0}', "--served-model-name", "a", "b",
    ]  # fmt: skip


def test_vllm_caches_and_temp_files_go_under_the_run_dir(tmp_path: Path) -> None:
    env = vllm_environment(InferenceConfig(output_dir=tmp_path))
    work = (tmp_path / "inference").resolve()
    for name in ("VLLM_CACHE_ROOT", "TMPDIR"):
        assert Path(env[name]).is_relative_to(work), name
    assert env["VLLM_CONFIGURE_LOGGING"] == "0"


def test_rpc_sockets_leave_a_run_dir_too_long_for_a_socket_path(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * UNIX_SOCKET_DIR_MAX)
    rpc = Path(vllm_environment(InferenceConfig(output_dir=deep))["VLLM_RPC_BASE_PATH"])
    assert not rpc.is_relative_to(deep.resolve())
    assert len(str(rpc)) <= UNIX_SOCKET_DIR_MAX


def test_runs_share_vllms_model_class_records_and_nothing_else(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    first, second = (tmp_path / name / "cache" for name in ("run1", "run2"))
    for cache in (first, second):
        cache.mkdir(parents=True)
        link_model_info_cache(cache)
    (first / "modelinfos" / "a-LlamaForCausalLM.json").write_text("{}")
    assert (second / "modelinfos" / "a-LlamaForCausalLM.json").read_text() == "{}"
    assert (first / "modelinfos").resolve() == (tmp_path / "xdg" / "envrl" / "vllm-modelinfos").resolve()
    assert sorted(p.name for p in first.iterdir()) == ["modelinfos"]
