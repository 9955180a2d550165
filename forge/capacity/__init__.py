"""Capacity under an SLO: ``search`` (the highest request rate a configuration serves with enough
requests within a TTFT/TPOT SLO, by bisection over simulated runs), ``report`` (its table, probes, plot
and report.md) and ``cli`` (``forge capacity``). Sits above the engine: it composes configs, builds the
configuration's replicas and reads their metrics; it may import cluster, config, core, engine, results
and workloads."""
