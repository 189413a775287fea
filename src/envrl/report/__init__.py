"""The run report: plots and a trace browser written into `<output_dir>/report/` (docs/report.md)."""
