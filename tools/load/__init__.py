"""Load generation for Triton models: workloads, asynchronous clients, schedules and reports.

``python -m tools.load`` is the command-line tool; ``tools.compare`` and ``tools.tune`` use the
same pieces in-process.
"""
