"""Routers: which replica of a cluster a new request goes to. One file and one
``conf/router/<name>.yaml`` each, like a scheduling policy.

Imports only ``forge.core``: a router sees a read-only ``ReplicaView`` of each replica (queue lengths,
outstanding work, KV usage, cached-prefix lookup) and returns an index; it never holds an engine."""
