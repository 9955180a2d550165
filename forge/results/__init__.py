"""What a run leaves behind: per-request and per-step metrics as DataFrames, the run directory's
report and plots, sweep reports, and the local sweep launcher.

Reads the scheduler's outputs and the KV manager's usage; never drives the engine."""
