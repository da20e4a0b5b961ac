"""The model's server, built when it loads: its engines, how it serves (``decide``) and what
``execute`` talks to (``Server``).

- A ``Runtime`` (``runtime.py``): the multi-entry multi-exit pipeline. Under ``auto`` on
  engines that overlap it measures this host's serving costs first (``calibrate.py``) and
  watches each second of serving (``Watch``), running every batch inside ``execute`` while
  ``decide.ModeSwitch`` says the plain way serves the load better (the whole model as one
  engine there where it fuses: ``_fused``; where the policy holds queries back for more, once it
  serves them: ``hold.py``), and a lone batch inside it while ``decide.LoneRuns`` says so.
  Under a configured policy on such engines the ``Watch`` reads the windows too, for whether
  ``execute`` waits for stage 0 (``execute_waits: auto``, ``decide.EntryWait``), and the pipeline
  stays the way served.
- A ``WholeBatch`` (``whole.py``): where ``auto`` steps aside on stages that share the host's
  cores (the stages fused into one engine, ``engines.fusable``) and for ``batching: triton``
  (the stages in turn, as sliced): ``execute`` runs the batch Triton formed and returns every
  response in its list, what a plain Python model does.

Nothing here imports Triton, so the choice can be tested directly.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from . import calibrate
from .config import RuntimeConfig
from .decide import (MIN_ANSWERS, Choice, EntryWait, HostCosts, LoneRuns, Mode, ModeSwitch, Window, capacities,
                     choose, fuses, interpreted, measured_s, waits, way)
from .device import CpuDevice, Device
from .dispatch import SmdpPolicy
from .engines import describe_graphs, describe_pins, fusable, graph_buckets, load_engines, on_host_cores
from .executor import Trace
from .hold import HeldBatch, Hold
from .host import Cpus, Machine, busy_s, cpus, machine
from .instances import FOLLOW_POLL_S, SharedMode
from .manifest import Manifest
from .metrics import (ANSWER_TIME, ANSWERS, BATCHES, ENTRY_ADMITTED, EXECUTE_IDLE, EXECUTE_TIME, EXECUTES, LONE_INLINE,
                      LONE_PIPELINE, RETURNED, RETURNED_TIME, STAGE_BUSY, Metrics)
from .nvml import NvmlError
from .padding import Buckets
from .query import Query, Reply, Tensors
from .runtime import BACKPRESSURE_MAX_S, Runtime
from .whole import WholeBatch, together

log = logging.getLogger(__name__)
WINDOW_S = 1.0  # how often the ModeSwitch looks at serving


class Server(Protocol):
    """What the backend's ``execute`` talks to, however the model serves."""

    ready: bool

    def runs_inline(self, inputs: Sequence[Tensors] = ()) -> bool:
        """Whether the batch of these requests' ``inputs`` runs inside ``execute`` (``run``), or is
        handed over (``submit``)."""

    def run(self, queries: Sequence[Query], meanwhile: Callable[[], None] | None = None) -> None: ...

    def run_straight(self, inputs: Sequence[Tensors], meanwhile: Callable[[list[Reply]], None]) -> int:
        """Where ``runs_inline``: run the requests of a call, none with a deadline, given as their
        inputs, hand their replies to ``meanwhile`` and say how many rows ran; or say 0 and do
        nothing (``WholeBatch.run_straight``)."""

    def submit(self, queries: Sequence[Query]) -> None: ...

    def gauges(self) -> dict: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Decision:
    mode: Mode
    choice: Choice
    waits: bool = False  # a pipeline's ``execute`` waits until stage 0 has computed its queries
    waits_why: str = ""
    graphs: str = ""  # the torch stages' CUDA graphs, where they have them (``engines.describe_graphs``)
    pins: str = ""  # where a lone ONNX Runtime session's workers are pinned (``engines.describe_pins``)
    costs: HostCosts = HostCosts()
    cpus: Cpus | None = None  # what the host lends this process (``host.py``)
    moved: str = ""  # where the stage tables were measured on another machine: that, and what to do
    first: str = ""  # where a switching model serves plain before any window, why (``ModeSwitch.begin``)

    def describe(self) -> str:
        return "; ".join(part for part in (f"serves {self.mode.value} ({self.choice.why})", self.first, self.waits_why,
                                           self.costs.describe() if self.costs.measured else "",
                                           self.graphs, f"on {self.cpus.describe()}" if self.cpus else "",
                                           self.pins) if part)


def serve(manifest: Manifest, version_dir: Path, config: RuntimeConfig, device: Device, metrics: Metrics,
          on_death: Callable[[str], None] | None = None, trace: Trace | None = None,
          round_trip: Callable[[], None] | None = None, server_cpu_s: Callable[[], float | None] | None = None,
          said: Callable[[str], None] | None = None, instances: int = 1,
          decoupled: bool = False, windows: Callable[[str], None] | None = None,
          model: str = "") -> tuple[Decision, Server]:
    """The model's engines loaded and its server built. ``round_trip``: one call to Triton's
    process (timed for a ``send()``); ``server_cpu_s``: tritonserver's CPU seconds so far;
    ``said``: where the switch's changes of mind and the policy's decisions are logged;
    ``windows``: where each window the switch read is logged with its reading (None: nowhere);
    ``instances``: the model's instances, which share the host's cores and, where it switches,
    one way of serving (``instances.SharedMode``, by ``model``, its name); ``decoupled``: every
    response is a ``send()``, served plain too."""
    graphs = config.graphs(manifest, not isinstance(device, CpuDevice))
    lengths = graph_buckets(manifest)[1] if graphs else ()
    buckets = Buckets({manifest.length_axis: lengths}) if lengths else Buckets()
    if graphs:  # every batch runs at a bucket's length, and a stage costs the host a graph's launch
        manifest = manifest.as_graphs()
    lent = cpus(instances)
    profiled = Machine.from_json(manifest.slicing.machine) if manifest.slicing and manifest.slicing.machine else None
    moved = machine(device.gpu, lent).moved_from(profiled) if profiled else ""
    cores = lent.share  # this instance's stub and its part of tritonserver (``decide.capacities``, ``ModeSwitch``)
    if said is not None:
        config.policy.said = said
    statistic = getattr(config.policy, "statistic", "mean")  # the tables' column the policy reads
    on_cores = on_host_cores(manifest, device)
    if config.batching == "triton":
        choice = Choice(False, "batching: triton")
    else:
        choice = choose(manifest, config.policy.auto, on_cores, statistic)
    mode = Mode.PIPELINE if choice.pipeline else (
        Mode.FUSED if fusable(manifest) and config.batching != "triton" else Mode.IN_TURN)
    metrics.serving(mode.value, choice.capacity)
    alone = mode is not Mode.PIPELINE or len(manifest.stages) == 1  # one session runs at a time
    engines = load_engines(manifest, version_dir, device, config.intra_op_thread_count, config.spins(alone),
                           mode is Mode.FUSED, graphs, cpus=lent)
    decision = Decision(mode, choice, graphs=describe_graphs(engines), pins=describe_pins(engines), cpus=lent,
                        moved=moved)
    if mode is not Mode.PIPELINE:
        manifest = manifest.fused() if mode is Mode.FUSED else manifest
        config.bind(manifest)
        form = together if config.batching == "triton" else _form_on_cores(config, manifest.max_batch_size)
        whole = WholeBatch(manifest, engines, device, metrics, config.pad_values, config.size_limits(manifest), form,
                           buckets, config.policy, config.queue.reject,
                           alike_together=form is together or config.policy.forms_alike_whole())
        if config.policy.holds and config.batching != "triton":
            return decision, HeldBatch(whole, config.policy)
        return decision, whole
    fused = _fused(manifest, version_dir, device, config, graphs, lent, said) \
        if choice.switches and fusable(manifest) and fuses(manifest, statistic) else []
    runtime = Runtime(manifest, engines, config, device, trace=trace, metrics=metrics, on_death=on_death,
                      buckets=buckets, fused=fused)
    # A lone batch inside ``execute`` would not wait for the control limit of a policy that holds
    # queries for more (an ``smdp`` weighing power: the slower engine, where it pipelines, read
    # 1.28x / 1.30x the best benchmark's objective at 0.1 / 0.5 load with them, pipelined ``smdp`` 1.00x /
    # 1.02x: docs/results/smdp-power-weight-plain-hold).
    lone = config.lone_inline == "true" or (config.lone_inline == "auto" and config.policy.auto
                                            and not config.policy.holds)
    costs = HostCosts()
    if not on_cores or lone:  # (on the host's cores the CPU time measured would be the engines')
        with runtime.entry.unseen():
            costs = calibrate.measure(manifest, device, lambda queries: runtime.submit(queries, whole=True),
                                      runtime.plain.run, round_trip, plain_sends=decoupled)
        metrics.clear()  # the calibration's batches are not the model's
        config.policy.measured(costs, len(manifest.stages))
        if choice.switches:
            tables = [s.latency for s in manifest.stages]
            metrics.serving(mode.value, capacities(tables, costs, cores, statistic, interpreted(manifest)))
    weighs_power = isinstance(config.policy, SmdpPolicy) and config.policy.power_weight > 0
    if weighs_power:
        _measure_energy(config.policy, manifest, device, runtime.plain.run, metrics)
    waited, waits_why = waits(manifest, config.execute_waits, costs)
    runtime.wait_s = BACKPRESSURE_MAX_S if waited else 0.0
    tabled = all(s.latency is not None for s in manifest.stages)
    if lone and tabled:
        runtime.lone = LoneRuns.of(manifest, costs)
    # A configured policy's pipeline on engines that overlap has its windows read too, for whether
    # its ``execute`` waits (the choice at load reads the tables: tables 16x too fast had ``policy:
    # pass`` wait at 16 in flight, 585 answers/s, where ``auto`` tried returning at once and kept it
    # at 781; docs/results/trial-verdict-pause).
    if choice.switches or (config.execute_waits == "auto" and not on_cores and tabled):
        if choice.switches and config.policy.holds:
            runtime.held = Hold(config.policy, runtime.run_held, runtime.entry.arrived, runtime.entry.steady_rate)
        switch = ModeSwitch([s.latency for s in manifest.stages], costs, cores, statistic, interpreted(manifest),
                            whole=manifest.fused().stages[0].latency if fused else None,
                            batcher_delay_s=config.queue.delay_us / 1e6, entry_waits=waited,
                            pinned=not choice.switches)
        runtime.watch = Watch(runtime, switch, metrics, device, len(manifest.stages),
                              _shared(server_cpu_s, lent.instances), said, alone=lent.instances == 1,
                              cores_busy_s=_cores_busy(lent),
                              entry=EntryWait(waited) if config.execute_waits == "auto" else None,
                              windows=windows,
                              shared=SharedMode.of(model, lent.instances) if choice.switches and model else None)
        if choice.switches and switch.begin() is not Mode.PIPELINE:
            runtime.watch.serve(switch.mode)
            decision = replace(decision, first=switch.last)
        runtime.watch.start()
    return replace(decision, waits=waited, waits_why=waits_why, costs=costs), runtime


def _fused(manifest: Manifest, version_dir: Path, device: Device, config: RuntimeConfig, graphs: bool, cpus: Cpus,
           said: Callable[[str], None] | None) -> list:
    """The whole model as one engine for the batches a switching model runs inside ``execute``
    (asked for where its stages fuse, ``engines.fusable``, and the whole is no slower, ``decide.fuses``).
    Served plain, it then costs the host one engine's call a batch, as the plain model does, not
    one a stage (near-zero compute at 1 in flight answered 0.91x the plain model with its two
    timed stages in turn: docs/results/check-auto-zero-in-stub). Torch stages load their weights
    a second time and capture their graphs again; where that fails (the device's memory), the
    stages run in turn and the log says why."""
    try:
        engines = load_engines(manifest, version_dir, device, config.intra_op_thread_count, config.spins(True), True,
                               graphs, cpus=cpus)
    except Exception as exc:  # the stages in turn serve plain as well, a little dearer
        log.exception("loading the stages fused failed")
        (said or log.info)(f"served plain, the stages run in turn: fusing them failed ({type(exc).__name__}: {exc})")
        return []
    (said or log.info)("served plain, the stages run fused as one engine (serving._fused)")
    return engines


def _way(mode: Mode) -> str:
    """What a model's instances share of a mode: pipelined or plain (each serves plain its own way,
    fused or its stages in turn, as its engines loaded)."""
    return mode.value if mode is Mode.PIPELINE else "plain"


def _shared(server_cpu_s: Callable[[], float | None] | None, instances: int) -> Callable[[], float | None] | None:
    """This instance's part of tritonserver's CPU seconds: the instances take turns at its
    requests (every instance reads the whole process's)."""
    if server_cpu_s is None:
        return None
    return lambda: None if (seconds := server_cpu_s()) is None else seconds / instances


def _cores_busy(lent: Cpus) -> Callable[[], float | None] | None:
    """The busy seconds of this process's cores (``host.busy_s``), where what the others on them
    spend is serving's to share: not where the model has several instances (each would count
    the others' stubs, which ``_shared`` already splits tritonserver among), nor under a cgroup's
    quota, whose cores also run other cgroups' work that takes none of the quota."""
    if lent.instances > 1 or (lent.quota is not None and lent.quota < lent.pinned):
        return None
    mine = frozenset(os.sched_getaffinity(0))
    return lambda: busy_s(mine)


def _measure_energy(policy: SmdpPolicy, manifest: Manifest, device: Device,
                    plain: Callable[[Sequence[Query]], None], metrics: Metrics) -> None:
    """The device's energy per batch, for a policy that weighs power, where the device counts it;
    elsewhere the policy keeps its proxy, and the model's log says why."""
    try:
        counter = device.energy_counter()
    except NvmlError as exc:
        policy.said(f"smdp energy per batch: the engines' busy seconds, a proxy ({exc})")
        return
    joules = calibrate.energy(manifest, plain, counter)
    metrics.clear()  # the measurement's batches are not the model's
    policy.energy_measured(joules)


def _form_on_cores(config: RuntimeConfig, max_batch_size: int):
    """Where compute is dear (ONNX Runtime on the CPU's cores) the policy's clusters by length
    save it (``whole.py``)."""
    def form(queries: Sequence[Query]) -> list[list[Query]]:
        return [batch for batch, _ in config.policy.form(queries, max_batch_size, time.monotonic())]
    return form


@dataclass(frozen=True)
class Reading:
    """What the ``Watch`` reads at the end of each window: the clock, this process's CPU seconds
    (less its waits for the device: ``calibrate.host_cpu_s``) and tritonserver's (None where it
    cannot be read), the metrics' counters, the answers a hold has sent (``Hold.sent``), the
    longest idle before an ``execute`` since the last reading (``Metrics.longest_idle_s``), and
    the busy seconds of the process's cores, whoever ran on them, with this process's whole CPU
    seconds (``Watch.others_s``; None where they are not read)."""

    clock: float
    cpu_s: float
    server_s: float | None
    counters: dict
    sent: int
    longest_idle_s: float
    cores_busy_s: float | None = None
    process_s: float = 0.0


class Watch(threading.Thread):
    """Every ``WINDOW_S``, what serving showed (the metrics' counters, this process's CPU and
    tritonserver's) goes to the ``ModeSwitch``, and the runtime serves as it says from the next
    ``execute`` on. The windows a switch straddles are not shown to it, and those of ``EntryWait``'s
    trial decide nothing (``ModeSwitch.observe``'s ``trial``), nor do the ``ModeSwitch``'s own
    trial's decide whether ``execute`` waits, nor one after which it leans the other way
    (``ModeSwitch.leaning``): the way served comes first (TensorRT-speed BERT-base under Poisson
    1,630/s, served pipelined from loading, tried returning at once in 10 lives of 18 before the
    switch had two windows to agree on, and stayed pipelined through their windows, answering in 2.4-3.5 ms
    where the lives served plain took 1.8-1.9: docs/results/check-head-slow-trt). After a
    window of too few answers the next starts with the load (``_resumed``). Where the model has
    other instances (``alone`` false), its ``execute`` calls are not shown either: Triton hands
    a batch to whichever instance is free, so an instance sits idle while another serves, and
    that idle would read as a round trip in series (``decide.round_trip_s``). ``cores_busy_s``:
    the busy seconds so far of the cores this process has (``host.busy_s``), where what the
    other processes on them spend counts against serving's (``Window.others_s``). ``entry``:
    where ``execute_waits`` is ``auto``, whether a pipelined ``execute`` waits for stage 0,
    decided again from each window served pipelined (``EntryWait``); under a configured policy
    that is all it decides (the switch ``pinned``)."""

    def __init__(self, runtime: Runtime, switch: ModeSwitch, metrics: Metrics, device: Device, stages: int,
                 server_cpu_s: Callable[[], float | None] | None, said: Callable[[str], None] | None,
                 alone: bool = True, cores_busy_s: Callable[[], float | None] | None = None,
                 entry: EntryWait | None = None, windows: Callable[[str], None] | None = None,
                 shared: SharedMode | None = None):
        super().__init__(name="dvabatch-mode-switch", daemon=True)
        self.runtime, self.switch, self.metrics, self.stages = runtime, switch, metrics, stages
        self.device, self.alone, self.entry, self._windows, self.shared = device, alone, entry, windows, shared
        self._server_cpu_s, self._said = server_cpu_s or (lambda: None), said or log.info
        self._cores_busy_s = cores_busy_s or (lambda: None)
        self._stopping = threading.Event()
        self._woken = threading.Event()  # set by the metrics' next record, or by ``stop`` (``_resumed``)

    def stop(self) -> None:
        self._stopping.set()
        self._woken.set()
        self.join()
        if self.shared is not None:
            self.shared.close()

    @property
    def follows(self) -> bool:
        """Whether another instance of the model decides the way this one serves (``SharedMode``)."""
        return self.shared is not None and not self.shared.leads

    def run(self) -> None:
        if self.shared is not None:
            self.shared.write(_way(self.runtime.mode))
        before = self._resumed(self._read())
        while not self._waited():
            now = self._read()
            window = self._window(before, now)
            try:
                if self.follows and self.shared.elect():  # the instance that led unloaded, or died
                    self.shared.write(_way(self.runtime.mode))
                    self._said(f"decides how the model's instances serve now ({self.shared.path.name})")
                served = self.switch.mode
                changed = self._led() if self.follows else \
                    self.switch.observe(window, trial=self.entry is not None and self.entry.trying)
                if self.runtime.lone is not None:
                    self.runtime.lone.scale = self.switch.off(Mode.PIPELINE)
                self._hold(window, now.sent - before.sent)
                settled = (served is Mode.PIPELINE and changed is None and self.switch.trying is None
                           and not self.switch.leaning)
                waits = self._entry(window if settled else None)
            except Exception:  # the switch must never take serving down: the mode stays
                log.exception("the mode switch failed")
                changed = waits = None
            before = now
            if self._windows is not None and window.answered:  # (an idle model logs nothing)
                self._windows(f"window served {way(served)}: {window.describe()}; read: {self.switch.last}")
            if changed is not None:
                self.serve(changed)
                self._said(f"serves {way(changed)} now: {self.switch.last}")
            if changed is not None or waits is not None:
                time.sleep(WINDOW_S / 2)  # the switch's own transient is no window
                before = self._read()
            elif window.answered < MIN_ANSWERS:
                before = self._resumed(now)

    def serve(self, mode: Mode) -> None:
        """The runtime serves ``mode`` from its next ``execute`` on, and the metrics say so (and,
        where this instance decides for the model's others, they do too)."""
        self.runtime.mode = mode
        self.metrics.serving(mode.value, {})
        if self.shared is not None:
            self.shared.write(_way(mode))

    def _waited(self) -> bool:
        """Whether the watch is stopping, once a window has passed, or for an instance that
        follows, as soon as the way it is told to serve is not the way it serves."""
        if not self.follows:
            return self._stopping.wait(WINDOW_S)
        for _ in range(max(round(WINDOW_S / FOLLOW_POLL_S), 1)):
            if self._stopping.wait(FOLLOW_POLL_S):
                return True
            if self._told() is not None:
                return False
        return False

    def _told(self) -> str | None:
        """The way the leading instance serves, where it is not the way this one serves."""
        led = self.shared.read()
        return None if led in (None, _way(self.runtime.mode)) else led

    def _led(self) -> Mode | None:
        """For an instance that follows: the way the leading instance serves, where it is not
        this one's (its own switch then serves so too, and decides nothing)."""
        if (led := self._told()) is None:
            return None
        self.switch.mode = Mode.PIPELINE if led == Mode.PIPELINE.value else self.switch.plain
        self.switch.last = f"as the model's instance that decides ({self.shared.path.name})"
        return self.switch.mode

    def _resumed(self, idle: Reading) -> Reading:
        """The reading once a query is admitted after ``idle`` (one that ended a window of too
        few answers to decide on, ``MIN_ANSWERS``, or loading): the next window starts with the
        load, not up to a window before it. A switch needs two windows in a row that agree
        (``ModeSwitch.observe``), and a load starting within the first is not the second's:
        TensorRT-speed BERT-base loaded afresh and run at 16 in flight for two seconds often
        stayed pipelined through them (a part window, then a whole one) and served its next
        load's first two seconds pipelined too, at 0.82x the plain model where it served plain
        (docs/results/check-head-slow-trt). Woken by the counters' next record (``Metrics.wake``),
        not by polling them: a timed wait costs this host's CPU 100-170 us a wake-up, and at
        50 a second an idle model took 0.8-1.1 % of a core, each idle model loaded beside the one
        that serves (docs/results/served-plain-flat)."""
        admitted = idle.counters.get(ENTRY_ADMITTED, 0.0)
        while True:
            self._woken.clear()  # (before looking at the stop: ``stop`` sets both, in that order)
            if self._stopping.is_set():
                return idle
            self.metrics.wake(self._woken)
            if self.metrics.snapshot().get(ENTRY_ADMITTED, 0.0) > admitted:  # (recorded before it asked)
                return self._read()
            self._woken.wait()

    def _entry(self, window: Window | None) -> bool | None:
        """Whether a pipelined ``execute`` waits for stage 0 from now on, where the window (one
        served pipelined; None for any other) decides it (``EntryWait``)."""
        if self.entry is None:
            return None
        host = None if window is None else self.switch.host_busy(window)
        waits = self.entry.observe(host, 0.0 if host is None else window.answered / window.seconds,
                                   None if window is None else measured_s(window), window is not None and window.paused)
        if waits is not None:
            self.runtime.wait_s = BACKPRESSURE_MAX_S if waits else 0.0
            self.switch.entry_waits = waits
            self._said(f"execute {'waits for stage 0' if waits else 'returns at once'} now: {self.entry.last}")
        return waits

    def _hold(self, window: Window, sent: int) -> None:
        """The arrival rate up to which a hold (``hold.py``) may hold queries back from now on
        (``ModeSwitch.hold_rate``: ``sent``, the answers it sent in the window, says whether it
        held); the log says when the window's own rate crosses it."""
        held = self.runtime.held
        most = None if held is None else self.switch.hold_rate(window, sent >= window.answered / 2)
        if most is None:
            return
        rate = window.answered / window.seconds
        if (rate < most) != (rate < held.most_per_s):
            self._said(f"{'holds queries' if rate < most else 'holds no queries'} served plain at {rate:.0f} "
                       f"answers/s: the host has room for each held answer's send() up to {most:.0f}/s")
        held.most_per_s = most

    def _read(self) -> Reading:
        sent = self.runtime.held.sent if self.runtime.held is not None else 0
        process_s = time.process_time()
        return Reading(time.monotonic(), calibrate.host_cpu_s(self.device, process_s), self._server_cpu_s(),
                       self.metrics.snapshot(), sent, self.metrics.longest_idle_s(), self._cores_busy_s(), process_s)

    def _window(self, before: Reading, now: Reading) -> Window:
        def delta(key) -> float:
            return now.counters.get(key, 0.0) - before.counters.get(key, 0.0)
        busy = tuple(delta((STAGE_BUSY.name, (("stage", str(s)),))) / 1e6 for s in range(self.stages))
        runs = rows = 0.0
        for key in now.counters:
            name, labels = key
            if name == BATCHES.name and dict(labels).get("stage") == "0":
                runs += delta(key)
                rows += delta(key) * int(dict(labels)["rows"])
        server = now.server_s - before.server_s if before.server_s is not None and now.server_s is not None else None
        # A hold's calls return at once, and one runs the held batch: they say nothing of a round trip.
        shown = self.alone and now.sent == before.sent
        calls = (delta((EXECUTE_TIME.name, ())) / 1e6, int(delta((EXECUTES.name, ()))),
                 delta((EXECUTE_IDLE.name, ())) / 1e6, now.longest_idle_s) if shown else ()
        returned = {"returned": int(delta((RETURNED.name, ()))),
                    "returned_s": delta((RETURNED_TIME.name, ())) / 1e6} if shown else {}
        answered = int(delta(ENTRY_ADMITTED))
        # A request's rows as stage 0 ran them (a batch that runs again row by row after a failure
        # counts its rows twice: one window's figure, within the switch's error).
        return Window(now.clock - before.clock, answered, now.cpu_s - before.cpu_s, server, busy,
                      rows / runs if runs else 1.0, *calls, others_s=self.others_s(before, now, server),
                      inline=int(delta(LONE_INLINE)), lone=int(delta(LONE_INLINE) + delta(LONE_PIPELINE)),
                      rows_a_request=rows / answered if answered else 1.0, piped=int(delta((ANSWERS.name, ()))),
                      piped_s=delta((ANSWER_TIME.name, ())) / 1e6, **returned)

    @staticmethod
    def others_s(before: Reading, now: Reading, server_s: float | None) -> float:
        """What the other processes on this process's cores spent between two readings: the
        cores' busy seconds less this process's and tritonserver's (0 where either is not read;
        never below 0: the cores' clock ticks in hundredths of a second)."""
        if before.cores_busy_s is None or now.cores_busy_s is None or server_s is None:
            return 0.0
        mine = now.process_s - before.process_s
        return max(now.cores_busy_s - before.cores_busy_s - mine - server_s, 0.0)
