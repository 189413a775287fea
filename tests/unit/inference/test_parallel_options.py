"""vLLM's own parallelism options pass through `inference.vllm` into vLLM's parsed server args unchanged."""

import pytest

from envrl.config import ConfigError
from envrl.inference.config import InferenceConfig
from envrl.inference.server import vllm_args


def test_tensor_and_data_parallel_sizes_reach_vllm_unchanged() -> None:
    config = InferenceConfig(vllm={"tensor_parallel_size": 2, "data_parallel_size": 3, "pipeline_parallel_size": 1})
    args = vllm_args(config, on_cpu=False)
    assert (args.tensor_parallel_size, args.data_parallel_size, args.pipeline_parallel_size) == (2, 3, 1)
    with pytest.raises(ConfigError, match="did you mean 'inference.vllm.tensor_parallel_size'"):
        vllm_args(InferenceConfig(vllm={"tensor_paralel_size": 2}), on_cpu=False)


@pytest.mark.parametrize("key", ["api_key", "api-key"])
def test_an_api_key_among_the_vllm_options_is_refused_since_argv_is_public(key: str) -> None:
    """vLLM would take it as `--api-key KEY`, readable by every local user in /proc/PID/cmdline."""
    with pytest.raises(ConfigError, match=f"'inference.vllm.{key}' cannot be set: a key on the command line"):
        vllm_args(InferenceConfig(vllm={key: "secret"}), on_cpu=False)
