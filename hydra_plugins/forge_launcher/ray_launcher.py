"""Exposes forge's Ray launcher (``forge.results.ray_launcher``) in the ``hydra_plugins`` namespace;
``conf/hydra/launcher/ray.yaml`` selects it."""

from __future__ import annotations

from forge.results.ray_launcher import RayLauncher as _RayLauncher


class RayLauncher(_RayLauncher):
    """See ``forge.results.ray_launcher.RayLauncher``."""
