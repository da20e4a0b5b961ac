"""perf_analyzer, the load generator Triton users measure with, run one window at a time.

A window is one perf_analyzer run against one model, with a warm-up it does not measure:

- **closed loop** (``concurrency``): that many requests in flight for ``seconds`` (three time
  windows of a third each, perf_analyzer's stability rule switched off so that it never repeats);
- **Poisson** (``rate``): perf_analyzer's own Poisson schedule, drawn from a fixed seed, so that
  every model of a comparison sees the same arrivals; a fixed number of requests
  (``--request-count``: rate x seconds), so that every request counts however late it comes back;
- **intervals** (``intervals``: a file of microseconds between requests, one per line, e.g. a
  recorded burst), also a fixed number of requests.

Each request's send and answer times come from perf_analyzer's profile export (read here, then
deleted: it also holds every input and output, so large requests (images) and answers (hidden
states) go through system shared memory instead of gRPC: ``transport``); its CSV gives Triton's
server-side columns.
Requests go over gRPC, or over HTTP where ``$DVABATCH_CLIENT_PROTOCOL`` says ``http`` (``protocol``:
a Triton user's clients may speak either, and tritonserver's frontends cost it differently; this
process still asks the server over gRPC for its statistics).
perf_analyzer stops at the first failed request; a window that did raises ``PerfAnalyzerError``
with perf_analyzer's own words (one that hung, ended without a word or left its export cut short
is run again; an open-loop run is seen to hang seconds after the server answered all it sends,
``Answered``, rather than at its long limit). The binary is ``<venv>/bin/perf_analyzer`` (``make setup``
installs it, ``tools.perf_analyzer.install``).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


DELAYED = re.compile(r"(\d+(?:\.\d+)?)% of the requests were delayed")
_REQUEST = re.compile(rb'\{"timestamp":(\d+),(?:"sequence_id":\d+,)?"request_inputs":')
HANG_AFTER_S, HANG_FACTOR, ATTEMPTS = 30.0, 4.0, 3  # a window runs past 30 s + 4 x its length only if hung
# An open-loop run still going this long after the server answered every request it sends has
# hung (``Answered``): perf_analyzer then only writes its export and report, in well under a second.
SETTLED_S = 5.0
POLL_S = 0.5  # how often a run is looked at
OPEN_ATTEMPTS = 6  # an open-loop window's: most of its losses cost SETTLED_S, and one core loses a third of its runs
T = TypeVar("T")
_ANSWERS = re.compile(rb'"response_timestamps":\[([0-9,]*)\]')


PROTOCOL = "DVABATCH_CLIENT_PROTOCOL"  # how perf_analyzer sends: grpc (unset) or http
PROTOCOLS = ("grpc", "http")


def protocol() -> str:
    """The protocol perf_analyzer's requests travel by, from ``$DVABATCH_CLIENT_PROTOCOL``
    (``grpc`` where it is unset or empty)."""
    text = os.environ.get(PROTOCOL, "").strip().lower() or "grpc"
    if text not in PROTOCOLS:
        raise ValueError(f"{PROTOCOL}={text!r}: expected one of {', '.join(PROTOCOLS)}")
    return text


VERSION = "2.51.0"  # the tritonclient wheel perf_analyzer comes from: Triton 24.10's, which nvidia-pytriton serves


class PerfAnalyzerError(RuntimeError):
    """perf_analyzer is missing, or a window failed; the message says why in its words."""


class WindowLost(PerfAnalyzerError):
    """A window that gave no result though no request failed: ``measure`` runs it again."""


class ExportError(WindowLost):
    """A window's profile export is empty or cut short (seen now and then with shared memory: one
    closed-loop window in 8 left it empty, one had a request without its answer list)."""


def venv() -> Path:
    return Path(sys.prefix)



def wrapper_path(prefix: Path | None = None) -> Path:
    return (prefix or venv()) / "bin" / "perf_analyzer"



def installed_version(binary: Path) -> str | None:
    """What ``binary --version`` says, or None if it does not run."""
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = (done.stdout + done.stderr).split()  # 2.51 prints it on stderr
    return words[words.index("Version") + 1] if done.returncode == 0 and "Version" in words else None



def binary() -> Path:
    """The installed perf_analyzer (``$DVABATCH_PERF_ANALYZER``, e.g. a GPU bundle's, else the
    virtualenv's), or an error saying how to install it."""
    given = os.environ.get("DVABATCH_PERF_ANALYZER")
    path = Path(given) if given else wrapper_path()
    if installed_version(path) != VERSION:
        raise PerfAnalyzerError(f"perf_analyzer {VERSION} is not installed at {path}: run `make setup` "
                                f"(or {Path(sys.executable).name} -m tools.perf_analyzer.install)")
    return path


@dataclass(frozen=True)
class Load:
    """What perf_analyzer sends: exactly one of a concurrency, a Poisson rate or an intervals file,
    each request of ``rows`` rows (its ``-b``: successive entries of the input data, as a client
    that sends a batch of its own)."""

    concurrency: int | None = None
    rate: float | None = None
    intervals: Path | None = None
    rows: int = 1

    def __post_init__(self):
        if sum(v is not None for v in (self.concurrency, self.rate, self.intervals)) != 1:
            raise ValueError("a load has one of concurrency, rate or intervals")
        if self.rows < 1:
            raise ValueError(f"a request has one row at least, not {self.rows}")

    @property
    def closed(self) -> bool:
        return self.concurrency is not None

    @property
    def label(self) -> str:
        of = f", {self.rows} rows a request" if self.rows > 1 else ""
        if self.concurrency is not None:
            return f"concurrency {self.concurrency}{of}"
        return (f"{self.rate:g}/s Poisson" if self.rate is not None else f"intervals {self.intervals.name}") + of

    def offered(self) -> float:
        """Requests per second the schedule asks for (open loop)."""
        if self.rate is not None:
            return self.rate
        gaps = [float(v) for v in self.intervals.read_text().split()]
        return len(gaps) / (sum(gaps) / 1e6)

    def flags(self) -> list[str]:
        rows = ["-b", str(self.rows)] if self.rows > 1 else []
        if self.concurrency is not None:
            return ["--concurrency-range", str(self.concurrency), *rows]
        if self.rate is not None:
            return ["--request-rate-range", f"{self.rate:g}", "--request-distribution", "poisson", *rows]
        return ["--request-intervals", str(self.intervals), *rows]


def write_bursts(path: Path, rates: Sequence[float], phase_s: float, seconds: float, seed: int = 0) -> Path:
    """An intervals file (``Load.intervals``) of Poisson arrivals whose rate steps through
    ``rates``, each held for ``phase_s``: a load that comes and goes, the paper's load diversity
    over time, where a stationary rate never moves a model that decides while it serves. The file
    holds whole cycles, enough to cover ``seconds``, from a fixed seed, so that every model of a
    comparison is sent the same arrivals. perf_analyzer starts the file over once it reaches its
    end: the first gap also carries the last cycle's quiet after its last arrival, so the cycles
    follow each other without a seam."""
    if phase_s <= 0 or not rates or min(rates) <= 0:
        raise ValueError(f"bursts need rates above 0 and phases of some length, not {list(rates)} for {phase_s} s")
    rng = np.random.default_rng(seed)
    cycle_s = phase_s * len(rates)
    cycles = max(1, math.ceil(seconds / cycle_s))
    arrivals: list[float] = []
    for start in np.arange(cycles) * cycle_s:
        for phase, rate in enumerate(rates):
            at, end = start + phase * phase_s, start + (phase + 1) * phase_s
            while (at := at + rng.exponential(1 / rate)) < end:  # memoryless: each phase starts afresh
                arrivals.append(at)
    if not arrivals:
        raise ValueError(f"bursts of {list(rates)}/s for {phase_s} s a phase send no request")
    gaps = np.diff(arrivals, prepend=arrivals[-1] - cycles * cycle_s)
    path.write_text("\n".join(str(max(1, round(gap * 1e6))) for gap in gaps) + "\n")
    return path


@dataclass(frozen=True)
class Window:
    """One measured window: every request's latency, in the order they were sent."""

    load: Load
    sent_s: np.ndarray  # seconds from the first send
    latency_ms: np.ndarray
    seconds: float  # from the first send to the last answer
    schedule_s: float  # open loop: the requests over the offered rate; closed loop: ``seconds``
    server_us: dict[str, float] = field(default_factory=dict)  # perf_analyzer's CSV: Triton's columns
    delayed_percent: float = 0.0  # open loop: requests perf_analyzer sent late (it warns past 10 %)

    @property
    def requests(self) -> int:
        return len(self.latency_ms)

    @property
    def mean_ms(self) -> float:
        return float(self.latency_ms.mean()) if self.requests else math.nan

    def percentile_ms(self, p: float) -> float:
        """Nearest rank, as perf_analyzer reports its percentiles."""
        return float(np.percentile(self.latency_ms, p, method="inverted_cdf")) if self.requests else math.nan

    @property
    def throughput(self) -> float:
        """Answers per second, until the last answer."""
        return self.requests / self.seconds if self.seconds > 0 else math.nan

    def goodput(self, qos_ms: float) -> float:
        """Answers within ``qos_ms`` per second of the load: under an open loop the offered rate
        times the share answered in time (every configuration is offered the same schedule)."""
        return int((self.latency_ms <= qos_ms).sum()) / self.schedule_s if self.schedule_s > 0 else math.nan


def read_export(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(send times, answer times) in nanoseconds of every request of a profile export. Read with a
    pattern, not a JSON parser: the file also holds every input and output (hundreds of kB per
    request for a BERT's hidden states)."""
    data = path.read_bytes()
    sent = [int(m.group(1)) for m in _REQUEST.finditer(data)]
    answers = [m.group(1) for m in _ANSWERS.finditer(data)]
    if not sent:
        raise ExportError(f"{path}: no requests ({len(data)} bytes)")
    if len(sent) != len(answers):
        raise ExportError(f"{path}: {len(sent)} requests but {len(answers)} answer lists; cut short, or not the "
                          f"export format of perf_analyzer 2.51")
    if any(not a for a in answers):
        raise PerfAnalyzerError(f"{path}: {sum(not a for a in answers)} requests were never answered")
    return np.array(sent, dtype=np.int64), np.array([int(a.rsplit(b",", 1)[-1]) for a in answers], dtype=np.int64)


def read_csv(path: Path) -> dict[str, float]:
    """perf_analyzer's CSV row (one level): column -> value."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return {}
    return {k: float(v) for k, v in rows[-1].items() if k and v not in (None, "")}


SHARED_MEMORY_BYTES = 1 << 16  # requests or answers past this travel through shared memory (see transport)


def _largest_request(data: Path) -> tuple[int, dict]:
    """(input values, the entry) of the entry of perf_analyzer's input data with the most input
    values; (0, {}) for data of several streams, and base64 content counts as one value: both go
    over gRPC as before."""
    entries = json.loads(data.read_text()).get("data", [])
    try:
        sized = [(sum(len(np.ravel(tensor["content"])) for tensor in entry.values()), entry) for entry in entries]
    except (AttributeError, KeyError, TypeError, ValueError):
        return 0, {}
    return max(sized, key=lambda item: item[0], default=(0, {}))


@functools.lru_cache(maxsize=64)
def transport(model: str, url: str, data: str) -> tuple[str, ...]:
    """perf_analyzer's flags for how the tensors of ``model``'s requests travel. Its profile export
    writes every request's inputs and outputs as JSON text: a 224x224 image's 600 kB a request ran
    to gigabytes, and perf_analyzer never finished writing them (a ResNet at 16 in flight); so did
    BERT-base's answers (64 x 768 floats, 197 kB each: every window on a lent H200 hung, and a model
    answering as much hung perf_analyzer even at one in flight on a 2-core CPU). Where a request's
    inputs or its answer pass ``SHARED_MEMORY_BYTES``, inputs and outputs go through system shared
    memory, which the export does not copy: every configuration of a comparison is sent the same
    way. The largest request is answered once over gRPC first, which sizes the output regions.
    Elsewhere (and for ``random`` / ``zero`` data, or data of several streams) gRPC carries them."""
    path = Path(data)
    if not path.is_file():
        return ()
    values, entry = _largest_request(path)
    if not entry:
        return ()
    with grpcclient.InferenceServerClient(url) as client:
        types = {t["name"]: t["datatype"] for t in client.get_model_metadata(model, as_json=True)["inputs"]}
        inputs = []
        for name, tensor in entry.items():
            array = np.asarray(tensor["content"]).reshape(tensor["shape"])[None]
            inputs.append(grpcclient.InferInput(name, list(array.shape), types[name]))
            inputs[-1].set_data_from_numpy(array.astype(grpcclient.triton_to_np_dtype(types[name])))
        try:
            result = client.infer(model, inputs).get_response(as_json=True)
        except InferenceServerException:  # perf_analyzer meets it too, and says so in its own words
            return ()
    answer = max(int(np.prod([int(d) for d in o["shape"]])) for o in result["outputs"])
    if 4 * max(values, answer) <= SHARED_MEMORY_BYTES:
        return ()
    return "--shared-memory", "system", "--output-shared-memory-size", str(8 * answer)  # 8: any dtype's bytes


def command(model: str, url: str, load: Load, data: str | Path, seconds: float, warmup_s: float,
            csv_path: Path, export: Path, http_url: str | None = None) -> list[str]:
    """The perf_analyzer command line of one window: to the gRPC address ``url``, or over HTTP
    to ``http_url`` where ``protocol`` says so."""
    sends = protocol()
    if sends == "http" and not http_url:
        raise ValueError(f"{PROTOCOL}=http, but no HTTP address was given for {model}")
    args = [str(binary()), "-m", model, "-u", http_url if sends == "http" else url, "-i", sends, "--async",
            "--input-data", str(data),
            *load.flags(), "-f", str(csv_path), "--profile-export-file", str(export),
            *transport(model, url, str(data))]
    # perf_analyzer splits a request count among its threads (the concurrency, or 4 for a rate)
    # and a thread given none runs forever: every count here leaves each thread a few. A closed
    # loop runs its warm-up too, which ``measure`` leaves out by time (``after_warmup``).
    if load.closed:
        args += ["-p", str(max(100, round((seconds + warmup_s) * 1000 / 3))), "-s", "100000", "-r", "3",
                 "--warmup-request-count", str(2 * load.concurrency)]
    else:
        warmup, counted = open_counts(load, seconds, warmup_s)
        args += ["--request-count", str(counted), "--warmup-request-count", str(warmup)]
    return args


def after_warmup(sent_ns: np.ndarray, answered_ns: np.ndarray,
                 warmup_s: float) -> tuple[np.ndarray, np.ndarray, float]:
    """A closed loop's requests answered after its first ``warmup_s`` seconds (sent in order),
    and when that was: its answers over the time from then to the last are its answers/s. perf_analyzer
    warms a closed loop up by a count only (``--warmup-request-count``, two a client: a few ms),
    so a model that decides how to serve from the load it sees (``auto``: two one-second windows
    of it) was measured as it decided, where an open loop's windows began seconds later: fresh
    lives of ``auto`` on TensorRT-speed BERT-base at 16 in flight answered 0.82x the plain model
    (geometric mean) in the 7 rounds whose window began pipelined, 1.09x in the 11 served plain
    throughout (docs/results/check-head-slow-trt). A warm-up whose end leaves nothing answered
    keeps every request."""
    start = sent_ns[0] + warmup_s * 1e9
    kept = answered_ns >= start
    if not kept.any():
        return sent_ns, answered_ns, float(sent_ns[0])
    return sent_ns[kept], answered_ns[kept], float(start)


def open_counts(load: Load, seconds: float, warmup_s: float) -> tuple[int, int]:
    """(warm-up, measured) requests an open-loop window sends: its rate times each length, and
    at least a second's worth measured (perf_analyzer wants it)."""
    rate = load.offered()
    return max(8, round(rate * warmup_s)), max(16, math.ceil(rate), round(rate * seconds))


@dataclass(frozen=True)
class Answered:
    """Whether the server has answered every request an open-loop run sends (``run_once``): its
    model's success and failure counts, from Triton's statistics, grown by ``expected`` since
    ``since``. Asked only once the run's schedule is over (``after_s``), so that the window is not
    disturbed. perf_analyzer 2.51 sometimes never ends such a run although the server answered
    everything: its profiler starts the workers and only then clears their records for the window
    (``InferenceProfiler::Profile``, then ``ProfileHelper``'s ``SwapRequestRecords``), so requests
    answered in between are lost to the window, which waits for a count it can no longer reach.
    With every process on one core a third of the runs or more hit that race. No other client may
    send to the model meanwhile."""

    url: str
    model: str
    expected: int
    after_s: float
    since: int

    @classmethod
    def from_now(cls, url: str, model: str, expected: int, after_s: float) -> Answered | None:
        """Counting from now; None where the server cannot say (perf_analyzer will, in its words)."""
        try:
            return cls(url, model, expected, after_s, _answered_so_far(url, model))
        except InferenceServerException:
            return None

    def __call__(self, elapsed_s: float) -> bool:
        if elapsed_s < self.after_s:
            return False
        try:
            return _answered_so_far(self.url, self.model) - self.since >= self.expected
        except InferenceServerException:  # the server cannot say: the run's own limit decides
            return False


def _answered_so_far(url: str, model: str) -> int:
    """Requests of ``model`` the server has answered, with a result or an error, since it loaded."""
    with grpcclient.InferenceServerClient(url) as client:
        stats = client.get_inference_statistics(model, as_json=True).get("model_stats", [])
    return sum(int(s.get("inference_stats", {}).get(kind, {}).get("count", 0)) for s in stats
               for kind in ("success", "fail"))


def run_once(args: list[str], limit: float, what: str, outputs: Sequence[Path] = (),
             answered: Callable[[float], bool] | None = None) -> subprocess.CompletedProcess:
    """Run perf_analyzer once, its ``outputs`` removed first (perf_analyzer refuses a profile
    export file that exists). perf_analyzer 2.51 sometimes never ends a window (about one Poisson
    window in 20 on two cores, a third or more on one; the server has answered everything it was
    sent): such a run is killed after ``limit``, or, where ``answered(seconds running)`` says the
    server answered every request it sends, ``SETTLED_S`` after that, a lost window."""
    for path in outputs:
        path.unlink(missing_ok=True)
    began, settled = time.monotonic(), None
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        while True:
            try:  # (output read meanwhile is kept for the next try)
                out, err = process.communicate(timeout=POLL_S)
                return subprocess.CompletedProcess(args, process.returncode, out, err)
            except subprocess.TimeoutExpired:
                pass
            running = time.monotonic() - began
            if answered is not None and settled is None and answered(running):
                settled = running
            if running > limit or (settled is not None and running - settled > SETTLED_S):
                process.kill()
                process.communicate()
                if running > limit:
                    raise WindowLost(f"perf_analyzer ({what}) hung for {limit:.0f} s")
                raise WindowLost(f"perf_analyzer ({what}) hung: the server had answered all its requests "
                                 f"{running - settled:.0f} s before")


def until_kept(attempt: Callable[[], T], attempts: int = ATTEMPTS) -> T:
    """``attempt()``, again while it loses its window (``WindowLost``: it hung, ended without a
    word or left its export cut short), up to ``attempts`` times in all; the last loss is raised."""
    for tried in range(1, attempts):
        try:
            return attempt()
        except WindowLost as exc:
            print(f"    {exc} (attempt {tried} of {attempts})", file=sys.stderr, flush=True)
    return attempt()


def check_ended(done: subprocess.CompletedProcess, export: Path, what: str) -> None:
    """Raise unless a run ended well: ``PerfAnalyzerError`` with perf_analyzer's words where a
    request failed, ``WindowLost`` where it ended without a word (a crash: once at 64 in flight
    here, its output stopping at "Request concurrency: 64"), so that no request failed."""
    if done.returncode == 0 and export.is_file():
        return
    output = done.stdout + done.stderr
    said = [line.strip() for line in output.splitlines() if "rror" in line or "ailed" in line]
    if said:
        raise PerfAnalyzerError(f"perf_analyzer ({what}) failed: " + " | ".join(dict.fromkeys(said)))
    raise WindowLost(f"perf_analyzer ({what}) ended with exit status {done.returncode} and no error: "
                     f"{output.strip()[-300:]}")


def measure(model: str, url: str, load: Load, data: str | Path, seconds: float, warmup_s: float = 1.0,
            timeout_s: float | None = None, http_url: str | None = None) -> Window:
    """One window of ``load`` against ``model`` at the gRPC address ``url`` (over HTTP to
    ``http_url`` where ``protocol`` says so: ``command``), sending the entries of
    ``data`` (perf_analyzer's ``--input-data``: a JSON file, ``zero`` or ``random``), after
    ``warmup_s`` seconds' worth of requests unmeasured: an open loop's counted at its rate
    (``open_counts``), a closed loop's by the clock (``after_warmup``)."""
    folder = Path(tempfile.mkdtemp(prefix="dvabatch-pa-"))
    try:
        csv_path, export = folder / "window.csv", folder / "export.json"
        args = command(model, url, load, data, seconds, warmup_s, csv_path, export, http_url)
        limit = timeout_s or HANG_AFTER_S + HANG_FACTOR * (seconds + warmup_s)
        what = f"{load.label} on {model}"

        def attempt() -> tuple[str, np.ndarray, np.ndarray]:
            all_answered = None if load.closed else Answered.from_now(
                url, model, sum(open_counts(load, seconds, warmup_s)), warmup_s + seconds)
            done = run_once(args, limit, what, (csv_path, export), all_answered)
            check_ended(done, export, what)
            return done.stdout + done.stderr, *read_export(export)

        output, sent, answered = until_kept(attempt, ATTEMPTS if load.closed else OPEN_ATTEMPTS)
        order = np.argsort(sent, kind="stable")
        sent, answered = sent[order], answered[order]
        start = sent[0]
        if load.closed:
            sent, answered, start = after_warmup(sent, answered, warmup_s)
        delayed = DELAYED.search(output)
        seconds = float(answered.max() - start) / 1e9
        return Window(load, (sent - start) / 1e9, (answered - sent) / 1e6, seconds,
                      seconds if load.closed else len(sent) / load.offered(),
                      read_csv(csv_path) if csv_path.is_file() else {}, float(delayed.group(1)) if delayed else 0.0)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
