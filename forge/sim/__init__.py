"""Time for the engine: the wall clock, and the simulated and profiled clocks that charge each step
what a cost model predicts for its batch on a named piece of hardware.

Imports ``forge.core`` (the step's data) and ``forge.models`` (a model's dimensions) only; measuring
a profile (``python -m forge.calibrate``) is an entry point above the engine."""
