"""Read a Triton metrics endpoint (Prometheus text): Triton's own series and the backend's."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Mapping

Series = tuple[str, frozenset]  # (metric name, frozenset of (label, value))
_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[Series, float]:
    values = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and not line.startswith("#"):
            name, labels, value = match.groups()
            values[(name, frozenset(_LABEL.findall(labels or "")))] = float(value)
    return values


def scrape(url: str, timeout_s: float = 5.0) -> dict[Series, float]:
    """Every series at ``url`` (e.g. ``http://127.0.0.1:8002/metrics``)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse(response.read().decode())


def select(values: Mapping[Series, float], name: str, **labels: str) -> dict[frozenset, float]:
    """The series of ``name`` whose labels include ``labels``, keyed by their full label set."""
    wanted = set(labels.items())
    return {series[1]: value for series, value in values.items() if series[0] == name and wanted <= series[1]}


def delta(before: Mapping[Series, float], after: Mapping[Series, float]) -> dict[Series, float]:
    """How much each series grew between two scrapes (counters; gauges give their change)."""
    return {series: value - before.get(series, 0.0) for series, value in after.items()}
