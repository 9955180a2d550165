"""Scheduling policies: one file and one ``conf/scheduler/<name>.yaml`` each."""
