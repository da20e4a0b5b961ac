"""python -m tools.soak: mixed traffic against a real Triton for minutes, checking every answer.

    python -m tools.soak MODEL_DIR [MODEL_DIR ...] [--policies auto,pass,random] [--rate 40]
                         [--seconds 120] [--window 10] [--bad-share 0.05] [--source FILE ...]

Serves each sliced model under each policy (one Triton model per pair, in a scratch repository,
on a loopback server of its own) and sends them Poisson traffic over async gRPC: good requests
of random rows and lengths, and a share of bad ones (an empty or too long axis, a wrong dtype)
that must be refused with INVALID_ARGUMENT. Every good answer is compared with ONNX Runtime on
the unsliced model. Per window it reports what was sent, answered right, answered wrong, lost
(never answered), answered twice, the errors by code, p50/p99 latency (drift) and the resident
memory of tritonserver and its stubs. Exit status 1 if anything was lost, wrong, duplicated or
failed that should not have. Bounded: ``--seconds`` of sending, then at most ``--timeout`` more.
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from backend.config import POLICIES, make_policy
from backend.engines import OnnxRuntimeEngine
from backend.errors import ConfigError
from backend.manifest import Manifest
from backend.sample import sample_inputs
from slicer.slicing import VERSION
from tools.lib.cli import names
from tools.lib.peers import find_source
from tools.lib.peers import write_variant
from tools.lib.processes import free_port, resident_mb
from tools.lib.triton import Server

FEEDS_PER_MODEL = 48
ATOL = 1e-4


@dataclass
class Target:
    """One served model (a sliced model under one policy) and the requests it gets."""

    model: str
    feeds: list[dict[str, np.ndarray]]
    expected: list[dict[str, np.ndarray]]
    bad: list[dict[str, np.ndarray]]


@dataclass
class Window:
    start_s: float
    sent: int = 0
    right: int = 0
    wrong: int = 0
    lost: int = 0
    duplicated: int = 0
    refused_right: int = 0  # bad requests refused with INVALID_ARGUMENT
    errors: Counter = field(default_factory=Counter)  # unexpected failures, by status
    latencies_ms: list[float] = field(default_factory=list)
    rss_mb: float = 0.0

    def row(self) -> dict:
        lat = np.array(self.latencies_ms) if self.latencies_ms else np.array([np.nan])
        return {"start_s": round(self.start_s, 1), "sent": self.sent, "right": self.right, "wrong": self.wrong,
                "lost": self.lost, "duplicated": self.duplicated, "refused_right": self.refused_right,
                "errors": dict(self.errors), "p50_ms": round(float(np.nanpercentile(lat, 50)), 2),
                "p99_ms": round(float(np.nanpercentile(lat, 99)), 2), "rss_mb": round(self.rss_mb, 1)}


def feeds_for(manifest: Manifest, limits: dict[str, int], count: int, rng: random.Random) -> list[dict]:
    """Good requests: 1-3 rows, every named axis a random size up to the model's limit (16 if
    none); integer inputs all 1, valid ids, masks and segments whatever the padding."""
    feeds = []
    for i in range(count):
        sizes = {axis: rng.randint(1, min(limits.get(axis) or 16, 64)) for axis in _axes(manifest)}
        feed = sample_inputs(manifest.inputs, rng.randint(1, min(3, manifest.max_batch_size)), sizes, seed=i)
        feeds.append({name: np.ones_like(a) if a.dtype.kind in "iub" else a for name, a in feed.items()})
    return feeds


def bad_feeds(manifest: Manifest, limits: dict[str, int], good: dict[str, np.ndarray]) -> list[dict]:
    """Requests the model must refuse: an empty named axis, one beyond its limit, a wrong dtype."""
    bad = []
    for axis in _axes(manifest):
        for size in [0, *([limits[axis] + 1] if limits.get(axis) else [])]:
            bad.append({name: np.ones_like(a) for name, a in
                        sample_inputs(manifest.inputs, 1, {axis: size}).items()})
    first = manifest.inputs[0].name
    wrong = np.float64 if good[first].dtype != np.float64 else np.float32
    bad.append({**good, first: good[first].astype(wrong)})
    return bad


def _axes(manifest: Manifest) -> list[str]:
    return sorted({d for spec in manifest.inputs for d in spec.dims if isinstance(d, str)})


def build(model_dirs: Sequence[Path], policies: Sequence[str], repository: Path, sources: Sequence[Path],
          seed: int) -> list[Target]:
    """Every model under every policy it can run, written into ``repository``, with its requests
    and answers."""
    rng, targets = random.Random(seed), []
    for model_dir in model_dirs:
        manifest = Manifest.load(model_dir / VERSION)
        source = find_source(manifest, None, sources)
        reference = OnnxRuntimeEngine(source, [o.name for o in manifest.outputs])
        limits = manifest.size_limits
        feeds = feeds_for(manifest, limits, FEEDS_PER_MODEL, rng)
        expected = [reference.run(feed) for feed in feeds]
        for policy in policies:
            try:  # a policy this model cannot run would stop tritonserver from starting at all
                make_policy(policy, {}).bind(manifest)
            except ConfigError as exc:
                print(f"soak: {model_dir.name} under policy {policy!r} left out: {exc}", flush=True)
                continue
            name = f"{model_dir.name}_{policy.replace('+', '_')}"
            write_variant(model_dir, repository, name, {"policy": policy})
            targets.append(Target(name, feeds, expected, bad_feeds(manifest, limits, feeds[0])))
    return targets




class Soak:
    """Sends the traffic and judges every answer as it comes back."""

    def __init__(self, url: str, targets: Sequence[Target], rate: float, seconds: float, window_s: float,
                 bad_share: float, seed: int, timeout_s: float, server_pid: int | None):
        self.url, self.targets, self.rate, self.seconds = url, list(targets), rate, seconds
        self.window_s, self.bad_share, self.timeout_s, self.server_pid = window_s, bad_share, timeout_s, server_pid
        self.rng = random.Random(seed)
        self.windows: list[Window] = []
        self._answers: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: dict[int, tuple] = {}  # id -> (window, target, feed index or None for bad, sent at)
        self._answered: Counter = Counter()
        self._sent_in: dict[int, Window] = {}
        self._lock = threading.Lock()

    def run(self) -> list[Window]:
        judge = threading.Thread(target=self._judge, daemon=True)
        judge.start()
        with grpcclient.InferenceServerClient(self.url) as client:
            start, next_at, ident = time.monotonic(), time.monotonic(), 0
            while (now := time.monotonic()) - start < self.seconds:
                index = int((now - start) // self.window_s)
                while len(self.windows) <= index:
                    self.windows.append(Window(len(self.windows) * self.window_s))
                    if self.server_pid:
                        self.windows[-1].rss_mb = resident_mb(self.server_pid)
                if now < next_at:
                    time.sleep(min(next_at - now, 0.01))
                    continue
                next_at += self.rng.expovariate(self.rate)
                self._send(client, ident, self.windows[index])
                ident += 1
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                with self._lock:
                    if not self._pending:
                        break
                time.sleep(0.05)
            time.sleep(0.2)  # answers still arriving would show up as duplicates
        self._answers.put(None)
        judge.join()
        with self._lock:
            for window, *_ in self._pending.values():
                window.lost += 1
        if self.server_pid and self.windows:
            self.windows[-1].rss_mb = max(self.windows[-1].rss_mb, resident_mb(self.server_pid))
        return self.windows

    def _send(self, client, ident: int, window: Window) -> None:
        target = self.rng.choice(self.targets)
        bad = self.rng.random() < self.bad_share
        index = None if bad else self.rng.randrange(len(target.feeds))
        feed = self.rng.choice(target.bad) if bad else target.feeds[index]
        inputs = []
        for name, array in feed.items():
            tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        with self._lock:
            self._pending[ident] = (window, target, index, time.monotonic())
            self._sent_in[ident] = window
            window.sent += 1
        try:
            client.async_infer(target.model, inputs, lambda result, error: self._answers.put((ident, result, error)),
                               client_timeout=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - a send failure is an answer too
            self._answers.put((ident, None, exc))

    def _judge(self) -> None:
        while (answer := self._answers.get()) is not None:
            ident, result, error = answer
            with self._lock:
                self._answered[ident] += 1
                if self._answered[ident] > 1:
                    self._sent_in[ident].duplicated += 1
                    continue
                window, target, index, sent = self._pending.pop(ident)
            status = error.status() if error is not None and hasattr(error, "status") else None
            if status == "StatusCode.DEADLINE_EXCEEDED":  # no answer within --timeout
                window.lost += 1
                continue
            window.latencies_ms.append((time.monotonic() - sent) * 1000)
            if index is None:
                if status == "StatusCode.INVALID_ARGUMENT":
                    window.refused_right += 1
                else:
                    window.errors[f"bad request: {status or 'answered'}"] += 1
            elif error is not None:
                window.errors[status or type(error).__name__] += 1
            elif all(np.allclose(result.as_numpy(name), value, atol=ATOL, rtol=0)
                     for name, value in target.expected[index].items()):
                window.right += 1
            else:
                window.wrong += 1


def report(windows: Sequence[Window]) -> tuple[str, bool]:
    """A table, one line per window and the totals; and whether the soak was clean."""
    rows = [w.row() for w in windows]
    head = f"{'window':>8} {'sent':>6} {'right':>6} {'wrong':>6} {'lost':>5} {'dup':>4} {'refused':>7} " \
           f"{'p50 ms':>8} {'p99 ms':>8} {'RSS MiB':>8}  errors"
    lines = [head] + [f"{r['start_s']:>7}s {r['sent']:>6} {r['right']:>6} {r['wrong']:>6} {r['lost']:>5} "
                      f"{r['duplicated']:>4} {r['refused_right']:>7} {r['p50_ms']:>8} {r['p99_ms']:>8} "
                      f"{r['rss_mb']:>8}  {r['errors'] or ''}" for r in rows]
    totals = {key: sum(r[key] for r in rows) for key in ("sent", "right", "wrong", "lost", "duplicated",
                                                          "refused_right")}
    errors = sum((Counter(r["errors"]) for r in rows), Counter())
    clean = totals["wrong"] == totals["lost"] == totals["duplicated"] == 0 and not errors
    lines.append(f"total: {totals}; unexpected errors: {dict(errors) or 'none'}; "
                 f"{'clean' if clean else 'NOT CLEAN'}")
    return "\n".join(lines), clean


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dirs", type=Path, nargs="+", help="model directories written by python -m slicer")
    p.add_argument("--policies", type=names(tuple(POLICIES)), default="auto,pass,random",
                   help="comma-separated policies to serve each model with")
    p.add_argument("--rate", type=float, default=40.0, help="requests per second, Poisson, over all models")
    p.add_argument("--seconds", type=float, default=120.0, help="how long to send")
    p.add_argument("--window", type=float, default=10.0, help="seconds per reported window")
    p.add_argument("--bad-share", type=float, default=0.05, help="share of requests that must be refused")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds an answer may take before it counts as lost")
    p.add_argument("--source", type=Path, action="append", default=[], help="an unsliced source model (any order)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write the windows as JSON here")
    args = p.parse_args(argv)
    for model_dir in args.model_dirs:
        if not (model_dir / VERSION / "manifest.json").is_file():
            p.error(f"{model_dir} is not a model directory written by python -m slicer")
    if args.rate <= 0 or args.seconds <= 0 or args.window <= 0 or not 0 <= args.bad_share <= 1:
        p.error("--rate, --seconds and --window must be > 0, --bad-share between 0 and 1")
    with tempfile.TemporaryDirectory(prefix="dvabatch-soak-") as scratch:
        targets = build(args.model_dirs, list(args.policies), Path(scratch), args.source, args.seed)
        if not targets:
            p.error("no model can run under any of the policies given")
        server = Server(model_repository=Path(scratch), grpc_port=free_port(), http_port=free_port(),
                        metrics_port=free_port(), log=Path(scratch) / "triton.log")
        with server:
            print(f"soak: {len(targets)} models ({', '.join(t.model for t in targets)}), {args.rate:g}/s for "
                  f"{args.seconds:g} s", flush=True)
            windows = Soak(server.grpc_url, targets, args.rate, args.seconds, args.window, args.bad_share,
                           args.seed, args.timeout, server.process.pid).run()
    text, clean = report(windows)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps([w.row() for w in windows], indent=1) + "\n")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
