"""Plain data every layer shares: a request in flight (``Request``), its ``SamplingParams``, and what
passes between the scheduler, the runner and the caller (``SchedulerOutput``, ``RequestOutput``), and how
a model's layers share the KV pool's pages (``KVCacheGroups``, which the KV manager and the backend both read).

Owns no behaviour beyond the data's own invariants; imports nothing else from forge."""
