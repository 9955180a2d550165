"""``forge route``: an OpenAI-compatible gateway over ``forge serve`` backends that picks a backend per
request with the same router classes the cluster simulator uses (``forge.routers``), fed from live
state. ``backends`` (each backend's state, health checks and the views routers read), ``prefixes`` (the
gateway's record of the prompt prefixes it sent where), ``proxy`` (the HTTP app: routing, retries,
streaming pass-through), ``spawn`` (local backends on loopback ports) and ``cli``. It may import config,
core, engine (its factory) and routers."""
