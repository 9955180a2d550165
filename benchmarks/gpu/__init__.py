"""The GPU device check (issue 39): ``device_check.sh``, ``fetch_wheels.sh`` and the Python they run."""
