"""``python -m tools.perf_analyzer.install``: the real perf_analyzer in the virtualenv (the
helpers that run it are in ``tools/lib/perf_analyzer.py``)."""
