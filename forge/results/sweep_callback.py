"""The Hydra callback that writes a sweep's report when ``python run.py -m ...`` ends.

Registered in ``conf/config.yaml``, so every run, a served one included, instantiates it: it is
kept apart from ``forge.results.sweep`` (pandas, matplotlib), which it imports only when a sweep ends.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class SweepReportCallback(Callback):
    """Writes the sweep report when a ``python run.py -m`` sweep ends (a failure only logs)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from forge.results.sweep import write_sweep_report

        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            log.info(f"sweep report: {write_sweep_report(sweep_dir)}")
        except Exception as e:  # the runs themselves are done and saved; never fail the sweep here
            log.warning(f"sweep report not written for {sweep_dir}: {e!r}")
