"""The scheduler: each step, every request gets (part of) the gap between its computed and known
tokens within a token budget, and ``update`` folds the step's sampled tokens back into the requests.

Owns the waiting queue, the step's rows, preemption and parallel-sampling forks. Imports only
``forge.core``, ``forge.policies`` (the ordering) and ``forge.kvcache`` (block bookkeeping); never a
model, a kernel or a clock."""
