"""Plain data every layer shares: a request in flight (``Request``), its ``SamplingParams``, and what
passes between the scheduler, the runner and the caller (``SchedulerOutput``, ``RequestOutput``).

Owns no behaviour beyond the data's own invariants; imports nothing else from forge."""
