"""A cluster: replicas (each a whole ``Engine``) behind a router, run by one event loop.

``conf/cluster/<name>.yaml`` describes the replicas (``spec``); ``build`` makes an engine per replica
from the run's config and the router from ``conf/router``; ``loop`` runs a workload over them, in one
simulated time under ``clock=simulated`` (bit for bit the same on every rerun; one replica is the
engine alone, bit for bit), in real time under ``clock=wall``; ``results`` merges the replicas'
records and says how evenly the load spread. Sits above ``engine``: nothing below imports it."""
