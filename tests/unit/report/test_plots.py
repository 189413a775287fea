"""The report's plots read well: one warm-up outlier does not flatten the throughput plot."""

from __future__ import annotations

import matplotlib.pyplot as plt

from envrl.report.plots import PLOTS, Run


def test_throughput_is_clipped_above_a_warm_up_outlier_and_names_its_value() -> None:
    records = [{"step": s, "process": "trainer", "trainer/tokens_per_s": 100.0 + s} for s in range(10)]
    records += [{"step": s, "process": "orchestrator", "perf/rollouts_per_s": 4.0} for s in range(10)]
    records[10 + 1]["perf/rollouts_per_s"] = 900.0  # step 1's batch was ready when step 0 ended
    [throughput] = [plot for plot in PLOTS if plot.name == "throughput"]
    fig, ax = plt.subplots()
    try:
        assert throughput.draw(ax, Run(records, []))
        tokens_axis, rollouts_axis = fig.axes
        assert rollouts_axis.get_ylim() == (0.0, 8.0)
        assert [t.get_text() for t in rollouts_axis.texts] == ["900.0"]
        assert tokens_axis.get_ylim()[1] > 109.0 and not tokens_axis.texts  # nothing to clip there
    finally:
        plt.close(fig)
