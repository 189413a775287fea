"""The data model: what crosses a process boundary (traces, training samples, the run directory's
layout, sampling seeds). Imports nothing else of envrl's but `config`."""
