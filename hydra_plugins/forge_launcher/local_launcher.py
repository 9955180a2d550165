"""Hydra only loads launchers from the ``hydra_plugins`` namespace: this exposes forge's local
launcher (implemented in ``forge.results.launcher``) there. ``conf/hydra/launcher/local.yaml`` selects it."""

from __future__ import annotations

from forge.results.launcher import LocalLauncher as _LocalLauncher


class LocalLauncher(_LocalLauncher):
    """See ``forge.results.launcher.LocalLauncher``."""
