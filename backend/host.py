"""The CPUs this process may use: the cores it is pinned to, capped by its cgroup's CPU quota.

A container's ``--cpus`` and a Kubernetes pod's CPU limit are a quota, not an affinity: a pod
limited to 2 CPUs on a 64-core node is pinned to all 64. Sized by the affinity alone, each
stage's ONNX Runtime session starts 64 threads that spend the quota in a few milliseconds and
are throttled for the rest of each period, and ``decide`` credits the stub and tritonserver
with 64 cores of time they do not have. Both cgroup versions are read: v2's ``cpu.max`` and
v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, at the process's cgroup and each of its
ancestors (a limit set on a parent binds its children; inside a container the process's path
may not exist under the mount, whose root is then the container's own cgroup). A model's
instances (``instance_group`` count) share them: each instance's sessions take its share, and
so does what ``decide`` credits its stub and tritonserver with. A session's threads are
physical cores, as ONNX Runtime's default counts them, and a session that runs alone has its
worker threads pinned one to a core, as ONNX Runtime's default pins them (``Cpus.pins``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

PROC_CGROUP = Path("/proc/self/cgroup")
PROC_STAT = Path("/proc/stat")
TICK_S = 1 / os.sysconf("SC_CLK_TCK")
CPUINFO = Path("/proc/cpuinfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")
SYSFS_CPU = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class Cpus:
    pinned: int  # logical CPUs in the affinity mask
    quota: float | None = None  # cores' worth of CPU time per period, the tightest on the path; None: no quota
    instances: int = 1  # the model's instances on these CPUs, each with sessions of its own
    cores: tuple[tuple[int, ...], ...] = ()  # the pinned CPUs by physical core (SMT siblings together); (): unread

    @property
    def limit(self) -> float:
        """Cores' worth of CPU time the process may use: what caps serving's throughput."""
        return self.pinned if self.quota is None else min(float(self.pinned), self.quota)

    @property
    def share(self) -> float:
        """An instance's share of the limit: the model's instances are balanced by Triton, and
        each one's stub and the tritonserver CPU spent on its requests take this much
        (``decide.capacities``, ``decide.ModeSwitch``)."""
        return self.limit / self.instances

    @property
    def physical(self) -> int | None:
        """Physical cores among the pinned CPUs; None where the topology cannot be read."""
        return len(self.cores) or None

    @property
    def threads(self) -> int:
        """Threads for a session: the whole cores of an instance's share of the limit, at least
        one. A fractional share rounds down: the stub and tritonserver spend the same CPUs, and
        a thread past a quota is throttled (a 1.5-CPU quota, the BERT-like example: 1.15x the
        answers with one thread). Instances that each took every core would run their sessions
        over each other (two instances of the BERT-like example on two cores: 0.5x / 0.6x the
        answers at 1 / 8 in flight of one thread each). Hyperthreads are not counted, as ONNX
        Runtime's own default counts them not: two threads on one core's compute units share
        them, and the siblings are left to the stub and tritonserver."""
        return max(1, math.floor(min(self.limit, self.physical or self.pinned) / self.instances + 1e-9))

    def pins(self, threads: int) -> tuple[tuple[int, ...], ...]:
        """The CPUs of each worker thread of a session that runs alone with ``threads`` threads: a
        physical core each, after the first, which is left to the thread that calls the session.
        ONNX Runtime pins a session's workers so by default, so a plain model's session has them
        pinned; unpinned, a fused BERT-like model's calls on 2 shared cores took about 90 us
        longer than the plain model's after 2 of 4 server starts, pinned after none of 7
        (docs/results/ort-pinned-workers). Its default reads every core of the machine; these
        are the process's own. Empty where the instance does not have a core for each thread to
        itself: instances share the cores, or the topology cannot be read."""
        if self.instances > 1 or threads > len(self.cores):
            return ()
        return self.cores[1:threads]

    def describe(self) -> str:
        quota = self.quota is not None and self.quota < self.pinned
        text = f"{self.pinned} cores"
        if self.physical and self.physical < self.pinned:
            text = f"{self.pinned} CPUs ({self.physical} physical cores)"
        if quota:
            text = f"{self.quota:g} CPUs (the cgroup's quota; {text} pinned)"
        if self.instances > 1:
            text += f" shared by {self.instances} instances"
        if self.threads != self.pinned:
            text += f": {self.threads} thread{'s' if self.threads > 1 else ''} a session"
        return text


@dataclass(frozen=True)
class Machine:
    """What a model's stage tables were measured on. They hold there alone: ``decide`` and
    the policies read them as this host's times, and the same stages on another CPU or GPU, or
    on another number of cores (ONNX Runtime's threads), take other times. The slicer writes it
    into the manifest (``SlicingReport.machine``); serving elsewhere is said when a model loads."""

    cpu: str  # the CPU's model name
    cpus: float  # cores' worth of CPU time the process could use (``Cpus.limit``)
    gpu: str = ""  # the GPU's name, where the stages run on one

    @classmethod
    def from_json(cls, data: dict) -> Machine | None:
        """As the manifest holds it (fields it does not know, from a later slicer, left out); None
        where it cannot be read (a hand-edited manifest must not keep the model from loading)."""
        try:
            return cls(str(data.get("cpu", "")), float(data.get("cpus", 0)), str(data.get("gpu", "")))
        except (AttributeError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        cores = f"{self.cpus:g} CPUs of {self.cpu or 'an unnamed CPU'}"
        return f"{self.gpu} (host: {cores})" if self.gpu else cores

    def moved_from(self, profiled: Machine) -> str:
        """Why tables ``profiled`` elsewhere may not be this machine's times ("" where they are):
        on a GPU its model decides a stage's time, on the CPU its model and the cores."""
        if self.gpu or profiled.gpu:
            same = self.gpu == profiled.gpu
        else:
            same = (self.cpu, self.cpus) == (profiled.cpu, profiled.cpus)
        return "" if same else (f"the stage tables were measured on {profiled.describe()}; it serves on "
                                f"{self.describe()}: measure them again here (python -m slicer.retime "
                                "MODEL_DIR) or slice the model here, so that auto and the policies decide on "
                                "this machine's own times")


def machine(gpu: str = "", lent: Cpus | None = None, cpuinfo: Path = CPUINFO) -> Machine:
    """This machine, as ``Machine`` says it: ``gpu``, the name of the GPU the stages run on;
    ``lent``, the CPUs this process may use (read where not given)."""
    name = ""
    for line in _read(cpuinfo).splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            name = value.strip()
            break
    return Machine(name, (lent or cpus()).limit, gpu)


def cpus(instances: int = 1, proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT,
         sysfs: Path = SYSFS_CPU) -> Cpus:
    """This process's CPUs: its affinity, its cgroup's quota where one is set, and its physical
    cores, shared by the model's ``instances`` on them."""
    pinned = os.sched_getaffinity(0)
    return Cpus(len(pinned), cgroup_quota(proc_cgroup, root), max(1, instances), core_groups(pinned, sysfs))


def busy_s(cpus: Collection[int], stat: Path = PROC_STAT) -> float | None:
    """The seconds the CPUs ``cpus`` have spent busy so far, whatever ran on them (user, nice,
    system, irq and softirq time in /proc/stat's line for each; not idle, iowait or the
    hypervisor's steal, in which nothing here runs); None where it cannot be read. What serving
    does not spend of it is the other processes on these cores (``decide.Window.others_s``)."""
    wanted, seconds = {f"cpu{cpu}" for cpu in cpus}, 0.0
    try:
        for line in stat.read_text().splitlines():
            fields = line.split()
            if fields and fields[0] in wanted:
                wanted.discard(fields[0])
                user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[1:8])
                seconds += (user + nice + system + irq + softirq) * TICK_S
    except (OSError, ValueError):
        return None
    return None if wanted else seconds


def instances_of(model_config: dict) -> int:
    """The model's instances (``instance_group`` in Triton's config JSON), each a stub of its own
    on the host's cores: a GPU group's count is per GPU it lists (Triton's normalized config lists
    every GPU where config.pbtxt named none)."""
    def count(group: dict) -> int:
        gpus = len(group.get("gpus") or []) if group.get("kind") == "KIND_GPU" else 1
        return int(group.get("count", 1)) * max(1, gpus)
    return sum(map(count, model_config.get("instance_group", []))) or 1


def core_groups(pinned: set[int], sysfs: Path = SYSFS_CPU) -> tuple[tuple[int, ...], ...]:
    """The ``pinned`` CPUs grouped by the physical core they are on, in CPU order: SMT siblings
    (a core's hyperthreads) share one ``core_cpus_list`` (``thread_siblings_list`` on older
    kernels). Empty where the topology cannot be read."""
    cores: dict[str, list[int]] = {}
    for cpu in sorted(pinned):
        topology = sysfs / f"cpu{cpu}" / "topology"
        siblings = _read(topology / "core_cpus_list") or _read(topology / "thread_siblings_list")
        if not siblings:
            return ()
        cores.setdefault(siblings, []).append(cpu)
    return tuple(map(tuple, cores.values()))


def cgroup_quota(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float | None:
    """The tightest CPU quota, in cores, on the process's cgroup path in either cgroup version;
    None where none is set or nothing can be read (not Linux, no cgroup mounted)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and not controllers:  # v2: one tree; also under unified/ on a hybrid host
            found += [q for base in (root, root / "unified") for q in _along(base, path, _v2)]
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own tree
            bases = {root / controllers, root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"}
            found += [q for base in bases for q in _along(base, path, _v1)]
    return min(found, default=None)


def _along(base: Path, path: str, read) -> list[float]:
    """The quotas ``read`` finds in ``base``'s folder for ``path`` and for each of its ancestors."""
    quotas = []
    for folder in [PurePosixPath(path), *PurePosixPath(path).parents]:
        relative = str(folder).lstrip("/")
        quota = read(base / relative if relative else base)
        if quota is not None:
            quotas.append(quota)
    return quotas


def _v2(folder: Path) -> float | None:
    """``cpu.max``: "QUOTA PERIOD" in microseconds, QUOTA "max" where none."""
    fields = _read(folder / "cpu.max").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _cores(fields[0], fields[1])


def _v1(folder: Path) -> float | None:
    """``cpu.cfs_quota_us`` (-1 where none) over ``cpu.cfs_period_us``."""
    return _cores(_read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us"))


def _cores(quota: str, period: str) -> float | None:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
