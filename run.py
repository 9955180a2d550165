"""``python run.py [group=option ...] [key=value ...]`` — the same as ``forge run ...``; see README.md.

A ``ConfigError`` (a setting forge refuses, with the setting's name in the message) is printed as
one line on stderr and exits with status 2, without a traceback; in a sweep (``-m``) it fails
that job as any other error does."""

from __future__ import annotations

import sys

from forge.cli import run_app

if __name__ == "__main__":
    run_app(sys.argv[1:])
