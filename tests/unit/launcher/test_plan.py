"""`plan`: one RLConfig becomes each process's complete config, and bad combinations are errors."""

from pathlib import Path

import pytest

from envrl.config import ConfigError, config_help, resolve_config
from envrl.config_schema import types_at_path
from envrl.launcher.config import EVAL_PORT_OFFSET, SET_BY_RL, RLConfig
from envrl.launcher.plan.run import Machine, plan

TWO_TRAIN_TWO_EVAL = [
    ("orchestrator.envs", '[{"id": "reverse-text"}, {"id": "reverse-text", "name": "second"}]'),
    ("orchestrator.eval.env", '[{"env": "reverse-text"}, {"env": "second"}]'),
]


def rl_config(*overrides: tuple[str, str]) -> RLConfig:
    return resolve_config(RLConfig, overrides=[("orchestrator.envs", '[{"id": "reverse-text"}]'), *overrides])


def test_shared_keys_reach_every_process_that_has_them(tmp_path: Path) -> None:
    rl = rl_config(
        ("model.name", "some/model"),
        ("output-dir", str(tmp_path)),
        ("max-steps", "7"),
        ("max-async-level", "2"),
        ("seed", "3"),
        ("resume", None),
    )
    run = plan(rl)
    for process in (run.trainer, run.orchestrator):
        assert (process.model.name, process.output_dir, process.max_steps) == ("some/model", tmp_path, 7)
        assert (process.max_async_level, process.seed, process.resume) == (2, 3, True)
    assert (run.inference.model.name, run.inference.output_dir) == ("some/model", tmp_path)


@pytest.mark.parametrize("key", ["trainer.seed", "orchestrator.max-steps", "inference.output-dir"])
def test_a_shared_key_set_inside_a_section_is_an_error_naming_it(key: str) -> None:
    rl = rl_config((key, "5"))
    dotted = key.replace("-", "_")
    with pytest.raises(ConfigError, match=f"'{dotted}' is shared by every process: set '{dotted.split('.')[1]}'"):
        plan(rl)


@pytest.mark.parametrize(
    ("key", "value", "owner", "source"),
    [
        ("orchestrator.inference.base-url", "http://127.0.0.1:9", "orchestrator.inference", "the inference servers"),
        ("orchestrator.inference.retry.max-retries", "3", "orchestrator.inference", "the inference servers"),
        ("orchestrator.inference.ready-timeout-s", "3", "orchestrator.inference", r"the inference .*ready_timeout_s\)"),
        ("trainer.resume", "true", "trainer.resume", "--resume"),
        ("trainer.weights.host", "10.0.0.1", "trainer.weights.host", "the hosts it places the trainer on"),
    ],
)
def test_a_key_rl_sets_itself_is_refused_naming_where_it_comes_from(
    key: str, value: str, owner: str, source: str
) -> None:
    with pytest.raises(ConfigError, match=f"'{owner}' is set by rl from {source}"):
        plan(rl_config((key, value)))


def test_the_inference_start_up_limit_is_the_inference_sections_and_the_orchestrator_waits_as_long() -> None:
    run = plan(rl_config(("inference.ready-timeout-s", "42")))
    assert run.inference.ready_timeout_s == run.orchestrator.inference.ready_timeout_s == 42


def test_rl_help_leaves_out_the_keys_rl_sets_itself() -> None:
    flags = {
        line.split()[0] for line in config_help(RLConfig, "rl", every_key=True).splitlines() if line.startswith("  --")
    }
    assert "--output-dir" in flags and "--inference.port" in flags
    assert not flags & {"--trainer.output-dir", "--orchestrator.seed", "--orchestrator.inference.base-url"}


def test_the_orchestrator_reaches_the_inference_server_the_launcher_starts() -> None:
    run = plan(rl_config(("inference.port", "8123")))
    assert run.orchestrator.inference.base_url == run.inference.base_url
    assert run.inference.base_url.endswith(":8123")


def test_train_and_eval_env_servers_get_consecutive_ports_in_their_own_blocks() -> None:
    run = plan(rl_config(*TWO_TRAIN_TWO_EVAL, ("env-server-base-port", "7100")))
    eval_base = 7100 + EVAL_PORT_OFFSET
    expected = [
        ("train", "reverse-text", "tcp://127.0.0.1:7100"),
        ("train", "second", "tcp://127.0.0.1:7101"),
        ("eval", "reverse-text", f"tcp://127.0.0.1:{eval_base}"),
        ("eval", "second", f"tcp://127.0.0.1:{eval_base + 1}"),
    ]
    assert [(s.split, s.name, s.config.address) for s in run.env_servers] == expected
    # The orchestrator connects to exactly the addresses the servers bind.
    addresses = [env.address for env in [*run.orchestrator.envs, *run.orchestrator.eval_envs()]]
    assert addresses == [address for _, _, address in expected]


def test_an_eval_only_env_gets_an_eval_server_only_and_an_external_env_none() -> None:
    envs = (
        '[{"id": "reverse-text"}, {"id": "reverse-text", "name": "held-out", "train": false},'
        ' {"id": "reverse-text", "name": "far", "address": "tcp://127.0.0.1:7900"}]'
    )
    evals = '[{"env": "held-out"}, {"env": "far"}]'
    run = plan(rl_config(("orchestrator.envs", envs), ("orchestrator.eval.env", evals)))
    expected = [("train", "reverse-text", "tcp://127.0.0.1:5000"), ("eval", "held-out", "tcp://127.0.0.1:6000")]
    assert [(s.split, s.name, s.config.address) for s in run.env_servers] == expected
    # the external server answers both the train and the eval rollouts of its env
    assert [env.address for env in run.orchestrator.eval_envs()] == ["tcp://127.0.0.1:6000", "tcp://127.0.0.1:7900"]


def test_an_env_with_its_own_address_gets_no_server_and_keeps_its_address() -> None:
    envs = '[{"id": "reverse-text", "address": "tcp://127.0.0.1:7900"}, {"id": "reverse-text", "name": "b"}]'
    run = plan(rl_config(("orchestrator.envs", envs)))
    assert [(s.name, s.config.address) for s in run.env_servers] == [("b", "tcp://127.0.0.1:5001")]
    assert run.orchestrator.envs[0].address == "tcp://127.0.0.1:7900"


def test_each_env_server_gets_its_envs_spec_pool_timeout_and_the_runs_restarts() -> None:
    envs = (
        '[{"id": "reverse-text", "args": {"max_len": 5}, "pool": {"min_workers": 3, "max_workers": 3},'
        ' "timeout": {"rollout_s": 12.5}}]'
    )
    run = plan(rl_config(("orchestrator.envs", envs), ("restarts.max-restarts", "4")))
    (server,) = run.env_servers
    assert (server.config.env.id, server.config.env.args) == ("reverse-text", {"max_len": 5})
    assert server.config.pool.min_workers == server.config.pool.max_workers == 3
    assert server.config.timeout.rollout_s == 12.5
    assert server.restarts.max_restarts == run.orchestrator.restarts.max_restarts == 4


def test_an_envs_own_restarts_is_refused_naming_the_runs() -> None:
    with pytest.raises(
        ConfigError,
        match=r"'orchestrator.envs\[0\].restarts'.*removed: one restart policy: under rl .*top-level `restarts`",
    ):
        rl_config(("orchestrator.envs", '[{"id": "reverse-text", "restarts": {"max_restarts": 4}}]'))
    with pytest.raises(ConfigError, match=r"'orchestrator.restarts' is set by rl from restarts"):
        plan(rl_config(("orchestrator.restarts.max-restarts", "4")))


def test_an_eval_port_block_reaching_the_inference_port_is_an_error_naming_both() -> None:
    rl = rl_config(*TWO_TRAIN_TWO_EVAL, ("env-server-base-port", "7000"), ("inference.port", "8001"))
    with pytest.raises(ConfigError, match=r"inference and eval env 'second' would both use port 8001"):
        plan(rl)


def test_an_env_address_inside_the_train_port_block_is_an_error() -> None:
    envs = '[{"id": "reverse-text", "address": "tcp://localhost:5001"}, {"id": "reverse-text", "name": "b"}]'
    with pytest.raises(
        ConfigError, match=r"train env 'b' and train env 'reverse-text' \(its address\) would both use port 5001"
    ):
        plan(rl_config(("orchestrator.envs", envs)))


def test_the_same_port_on_another_host_is_no_overlap() -> None:
    envs = '[{"id": "reverse-text", "address": "tcp://10.0.0.7:8000", "insecure": true}]'
    (env,) = plan(rl_config(("orchestrator.envs", envs))).orchestrator.envs
    assert env.address == "tcp://10.0.0.7:8000"


def test_weights_of_every_checkpoint_are_kept_unless_the_user_says_otherwise() -> None:
    run = plan(rl_config(("trainer.ckpt.interval", "7")))
    assert run.orchestrator.keep_weights_every == 7
    run = plan(rl_config(("trainer.ckpt.interval", "7"), ("orchestrator.keep-weights-every", "0")))
    assert run.orchestrator.keep_weights_every == 0


def test_an_env_with_its_own_chat_client_gets_a_server_that_serves_that_client() -> None:
    teacher = '{"base_url": "https://api.example.com/v1", "model": "teacher", "api_key_env": "TEACHER_KEY"}'
    run = plan(rl_config(("orchestrator.envs", f'[{{"id": "reverse-text", "client": {teacher}}}]')))
    (server,) = run.env_servers
    client = server.config.client
    assert client is not None and client.type == "eval"
    assert (client.base_url, client.model, client.api_key_env) == (
        "https://api.example.com/v1",
        "teacher",
        "TEACHER_KEY",
    )
    assert server.allowed_env() == ["TEACHER_KEY"]
    assert run.orchestrator.envs[0].own_client.type == "eval"


def test_plan_leaves_the_config_as_it_was_and_touches_no_file(tmp_path: Path) -> None:
    rl = rl_config(
        ("output-dir", str(tmp_path / "run")),
        *TWO_TRAIN_TWO_EVAL,
        ("trainer.lora.rank", "8"),
        ("placement.inference.replicas", "2"),
    )
    before = rl.model_dump(mode="json")
    for hosts in (None, ["h0", "h1"]):
        run = plan(rl, hosts)
        assert run.orchestrator.envs[0].address is not None and run.orchestrator.eval.addresses
    assert rl.model_dump(mode="json") == before  # no address, key, derived default or lora option written back
    assert [env.address for env in rl.orchestrator.envs] == [None, None]
    assert not (tmp_path / "run").exists()  # the CURVE keys are named, not made


def test_one_host_runs_everything_on_loopback_and_names_the_secrets_to_make(tmp_path: Path) -> None:
    run = plan(rl_config(("output-dir", str(tmp_path)), ("placement.inference.replicas", "2")))
    assert run.hosts == ["127.0.0.1"] and set(run.host_of.values()) == {0}
    assert [c.name for c in run.on_host(0)] == [
        "inference-0", "inference-1", "train env server 'reverse-text'", "trainer", "orchestrator",
    ]  # fmt: skip
    assert run.orchestrator.inference.base_url == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]
    assert run.trainer.weights.host == "127.0.0.1"
    assert [secret.name for secret in run.secrets] == ["ENVRL_RELOAD_TOKEN", "ENVRL_INFERENCE_API_KEY"]
    assert run.curve_dir.is_relative_to(tmp_path)
    secrets = {c.name: c.secrets for c in run.commands.commands()}
    assert secrets["train env server 'reverse-text'"] == ["ENVRL_INFERENCE_API_KEY"]
    assert secrets["trainer"] == [] and "ENVRL_RELOAD_TOKEN" in secrets["orchestrator"]


def test_two_hosts_get_the_same_processes_with_addresses_on_their_hosts(tmp_path: Path) -> None:
    rl = rl_config(
        ("output-dir", str(tmp_path)),
        *TWO_TRAIN_TWO_EVAL,
        ("slurm.trainer-nodes", "2"),
        ("slurm.env-node", "1"),
    )
    one, job = plan(rl), plan(rl, ["gpu-a", "gpu-b"])
    assert [c.name for c in job.on_host(0)] == ["trainer", "orchestrator"]
    assert [c.name for c in job.on_host(1)] == [
        "inference", *[c.name for c in one.commands.env_servers], "trainer-node1",
    ]  # fmt: skip
    configs = job.configs()
    assert set(configs) == set(one.configs())
    assert configs["inference"].host == "gpu-b" and configs["inference"].reload.allow_remote
    assert [env.address for env in job.orchestrator.envs] == ["tcp://gpu-b:5000", "tcp://gpu-b:5001"]
    assert set(job.orchestrator.eval.addresses.values()) == {"tcp://gpu-b:6000", "tcp://gpu-b:6001"}
    assert all(s.config.client.base_urls == ["http://gpu-b:8000"] for s in job.env_servers)
    assert job.trainer.weights.host == "gpu-a" and job.orchestrator.inference.base_url == "http://gpu-b:8000"
    # what does not depend on the hosts is the one-host plan's
    assert job.trainer.model_copy(update={"weights": one.trainer.weights}).model_dump() == one.trainer.model_dump()
    assert [s.config.env for s in job.env_servers] == [s.config.env for s in one.env_servers]


def test_a_job_with_a_host_count_other_than_its_nodes_is_refused() -> None:
    with pytest.raises(ConfigError, match="1 hosts given for a job of slurm.nodes = 2"):
        plan(rl_config(), ["only-one"])


def test_the_placement_keys_of_the_process_sections_still_work_with_a_warning_naming_their_new_keys() -> None:
    warned: list[str] = []
    old = [("orchestrator.envs", '[{"id": "reverse-text"}]'), ("trainer.gpus", "[1]"), ("inference.replicas", "2")]
    rl = resolve_config(RLConfig, overrides=old, warn=warned.append)
    assert (rl.placement.trainer.gpus, rl.placement.inference.replicas) == ([1], 2)
    assert [line.split(" (from")[0] for line in warned] == [
        "config key 'trainer.gpus'",
        "config key 'inference.replicas'",
    ]
    assert "is now 'placement.trainer.gpus'" in warned[0] and "from envrl 0.3.0" in warned[0]


def test_every_key_rl_sets_itself_is_a_key_of_its_config() -> None:
    """`SET_BY_RL` and `owned_keys` are dotted strings: each must name a key, or its refusal never fires."""
    for dotted in [*SET_BY_RL, *RLConfig.owned_keys]:
        assert types_at_path(RLConfig, dotted.split(".")), f"{dotted} is no key of RLConfig"


def test_a_teacher_named_by_its_weights_is_a_second_server_the_orchestrator_is_pointed_at(tmp_path: Path) -> None:
    rl = rl_config(
        ("output-dir", str(tmp_path)),
        ("trainer.lora.rank", "8"),
        ("orchestrator.distill.teacher-weights", "outputs/teacher/weights/final"),
        ("orchestrator.distill.teacher-port", "8123"),
    )
    run = plan(rl)
    assert run.teacher is not None
    assert (run.teacher.model.name, run.teacher.port) == ("outputs/teacher/weights/final", 8123)
    assert (
        "enable_lora" in run.inference.vllm and "enable_lora" not in run.teacher.vllm
    )  # the teacher is merged weights
    distill = run.orchestrator.distill
    assert distill is not None and distill.teacher_url == "http://127.0.0.1:8123" and distill.teacher_weights is None
    assert distill.teacher_api_key_env == "ENVRL_INFERENCE_API_KEY"  # rl's teacher takes the run's key
    assert [c.name for c in run.on_host(0)][:2] == ["inference", "teacher"]
    teacher = run.commands.teacher
    assert teacher is not None and teacher.argv[-1].endswith("configs/teacher.toml")
    assert teacher.log_file == tmp_path / "logs" / "teacher.log"
    assert set(teacher.secrets) == {"ENVRL_RELOAD_TOKEN", "ENVRL_INFERENCE_API_KEY"}
    assert (
        "teacher" in run.configs()
        and (run.teacher.host, 8123, "the teacher (orchestrator.distill.teacher_port)") in run.spawned_ports()
    )


def test_a_teacher_url_starts_no_teacher_and_is_left_as_given() -> None:
    run = plan(rl_config(("orchestrator.distill.teacher-url", "http://10.0.0.9:8100/v1")))
    assert run.teacher is None and run.commands.teacher is None and "teacher" not in run.configs()
    assert run.orchestrator.distill is not None and run.orchestrator.distill.teacher_url == "http://10.0.0.9:8100/v1"


def test_a_teacher_on_the_inference_port_is_an_error_naming_both() -> None:
    rl = rl_config(("orchestrator.distill.teacher-weights", "w"), ("orchestrator.distill.teacher-port", "8000"))
    with pytest.raises(
        ConfigError, match=r"inference and the teacher \(orchestrator.distill.teacher_port\) would both use port 8000"
    ):
        plan(rl)


def test_a_slurm_job_serves_the_teacher_on_the_first_inference_host_on_its_own_devices() -> None:
    rl = rl_config(
        ("orchestrator.distill.teacher-weights", "w"),
        ("slurm.nodes", "3"),
        ("slurm.inference-nodes", "2"),
        ("placement.trainer.gpus", "[0, 1, 2, 3, 4, 5, 6, 7]"),  # another host: may overlap the others' lists
        ("placement.inference.gpus", "[0, 1, 2, 3, 4, 5]"),
        ("placement.inference.replicas", "6"),
        ("placement.teacher.gpus", "[6, 7]"),
        ("inference.vllm", '{"tensor_parallel_size": 1}'),
    )
    run = plan(rl, ["gpu-a", "gpu-b", "gpu-c"])
    assert run.teacher is not None and (run.teacher.host, run.teacher.port) == ("gpu-b", 8100)
    assert run.teacher.reload.allow_remote  # off loopback: the run's token guards it
    assert run.orchestrator.distill is not None and run.orchestrator.distill.teacher_url == "http://gpu-b:8100"
    teacher = run.commands.teacher
    assert teacher is not None and run.host_of["teacher"] == 1
    assert teacher.env["CUDA_VISIBLE_DEVICES"] == "6,7"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (  # a job: every role has devices
            [],
            r"places its roles on GPUs .* set placement.teacher.gpus",
        ),
        (
            [("placement.inference.gpus", "[0, 1]"), ("placement.teacher.gpus", "[1, 2]")],
            r"placement.inference.gpus \[0, 1\] and placement.teacher.gpus \[1, 2\] overlap on \[1\]",
        ),
        (  # the steps start at once: two vLLM servers would size their memory against each other
            [
                ("placement.inference.gpus", "[0, 1]"),
                ("placement.teacher.gpus", "[0, 1]"),
                ("inference.vllm", '{"gpu_memory_utilization": 0.4}'),
            ],
            r"placement.teacher.gpus = placement.inference.gpus = \[0, 1\] in a --slurm job",
        ),
        (  # the replicas would see every device of the host
            [("placement.teacher.gpus", "[7]")],
            r"placement.teacher.gpus = \[7\], but placement.inference.gpus on the teacher's host is empty",
        ),
    ],
)
def test_a_teacher_in_a_slurm_job_needs_devices_no_replica_sees(overrides: list[tuple[str, str]], message: str) -> None:
    rl = rl_config(("orchestrator.distill.teacher-weights", "w"), *overrides)
    with pytest.raises(ConfigError, match=message):
        plan(rl, ["gpu-a", "gpu-b"])


def test_a_gpu_run_serves_the_teacher_on_its_devices_beside_the_other_roles() -> None:
    rl = rl_config(
        ("orchestrator.distill.teacher-weights", "w"),
        ("placement.trainer.gpus", "[0]"),
        ("placement.inference.gpus", "[1]"),
        ("placement.teacher.gpus", "[2]"),
    )
    run = plan(rl, machine=Machine(visible_gpus=["GPU-a", "GPU-b", "GPU-c"]))
    assert run.commands.teacher is not None and run.commands.teacher.env["CUDA_VISIBLE_DEVICES"] == "GPU-c"
    assert run.teacher is not None and run.teacher.host == "127.0.0.1" and run.host_of["teacher"] == 0
    assert not run.placement.teacher_shares_inference  # started beside the student's server


def test_a_teacher_sharing_the_inference_devices_must_leave_room_for_both_servers() -> None:
    shared = [
        ("orchestrator.distill.teacher-weights", "w"),
        ("placement.trainer.gpus", "[0]"),
        ("placement.inference.gpus", "[1]"),
        ("placement.teacher.gpus", "[1]"),
    ]
    with pytest.raises(
        ConfigError,
        match=r"two vLLM servers .* inference.vllm.gpu_memory_utilization = 0.9 of .*; set it to 0.45 or less",
    ):
        plan(rl_config(*shared))
    run = plan(rl_config(*shared, ("inference.vllm", '{"gpu_memory_utilization": 0.4}')))
    assert run.commands.teacher is not None and run.commands.teacher.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert run.placement.teacher_shares_inference  # so the launcher starts it once the student's server serves


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [("orchestrator.distill.teacher-weights", "w"), ("placement.trainer.gpus", "[0]")],
            r"places its roles on GPUs .* set placement.teacher.gpus",
        ),
        (
            [
                ("orchestrator.distill.teacher-weights", "w"),
                ("placement.trainer.gpus", "[0, 1]"),
                ("placement.inference.gpus", "[2]"),
                ("placement.teacher.gpus", "[1]"),
            ],
            r"placement.trainer.gpus \[0, 1\] and placement.teacher.gpus \[1\] overlap on \[1\]",
        ),
        (
            [("orchestrator.distill.teacher-url", "http://h:1/v1"), ("placement.teacher.gpus", "[1]")],
            "placement.teacher.gpus is set but orchestrator.distill.teacher_weights is not",
        ),
    ],
)
def test_teacher_placements_that_cannot_work_are_one_line_naming_the_keys(
    overrides: list[tuple[str, str]], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        plan(rl_config(*overrides))
