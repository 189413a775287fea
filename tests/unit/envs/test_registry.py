"""Loading environments by id: installed entry points, `module:function` ids, clear errors."""

import pytest

from envrl.envs import Environment, EnvironmentNotFound, installed_environment_ids, load_environment

EXAMPLES = ["distinct-rank", "guess-number", "kv-store", "learnable", "reverse-text"]


def not_an_env() -> str:
    return "surprise"


def tiny_env(num: int = 2) -> Environment:
    from envrl.data.traces import Task

    class PromptTask(Task):
        prompt: str

    return Environment(tasks=[PromptTask(idx=i, prompt=str(i)) for i in range(num)])


def test_example_envs_are_installed_and_load_by_id_with_arguments() -> None:
    assert set(EXAMPLES) <= set(installed_environment_ids())
    for env_id in EXAMPLES:
        env = load_environment(env_id)
        assert env.env_id == env_id and env.num_tasks("train") > 0 and env.num_tasks("eval") > 0
    assert load_environment("reverse-text", num_train=7).num_tasks("train") == 7


def test_an_unknown_id_lists_the_installed_ones() -> None:
    with pytest.raises(EnvironmentNotFound, match="no environment 'reverse-txt' is installed") as caught:
        load_environment("reverse-txt")
    assert all(env_id in str(caught.value) for env_id in EXAMPLES)


def test_module_function_ids_are_imported_directly() -> None:
    env = load_environment(f"{__name__}:tiny_env", num=3)
    assert env.num_tasks("train") == 3 and env.env_id == f"{__name__}:tiny_env"
    with pytest.raises(EnvironmentNotFound, match="has no 'missing'"):
        load_environment(f"{__name__}:missing")
    with pytest.raises(EnvironmentNotFound, match="cannot import module"):
        load_environment("no_such_module_xyz:load")


def test_a_loader_that_returns_something_else_is_named() -> None:
    with pytest.raises(TypeError, match="returned str, not an envrl Environment"):
        load_environment(f"{__name__}:not_an_env")


def test_a_verifiers_id_where_verifiers_is_not_installed_says_where_to_run_it() -> None:
    # envrl's own venv never has verifiers: its envs run in a project of their own.
    with pytest.raises(EnvironmentNotFound, match="needs the 'verifiers' package.*docs/adapters.md"):
        load_environment("verifiers:digits-count")
