"""The plan of an `rl` run: `run.plan(rl, hosts, machine)` turns one `RLConfig` into every process's
config, host, devices and command, purely; its parts (placement, cores, commands, teacher, replicas,
cross-process checks) live beside it and are used by nothing but the plan and `rl`."""
