"""Scheduling policies: one file and one ``conf/scheduler/<name>.yaml`` each.

Imports only ``forge.core``: a policy orders requests, it never touches blocks or models."""
