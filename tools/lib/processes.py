"""Processes and ports: a free port, a process's children and its resident memory, the host's
CPUs split between the server and its clients (Linux)."""

from __future__ import annotations

import functools
import os
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CLIENT_CPUS = "DVABATCH_CLIENT_CPUS"


@dataclass(frozen=True)
class CpuSplit:
    """The CPUs the clients (this process, perf_analyzer) run on and those left to tritonserver
    and its stubs, where ``$DVABATCH_CLIENT_CPUS`` names the former (``0``, ``0-1``, ``0,2``).
    A user's clients run on other machines; on one host, a client sharing the server's cores
    takes CPU from it at random moments, and its windows move with that (on the project's 2-core
    host the plain model's windows at 16 in flight spread 12 %, 7 % with the client on a core of
    its own). The server's CPUs are all others this process may use (``os.sched_getaffinity``)."""

    client: frozenset[int]
    server: frozenset[int]

    @classmethod
    def from_env(cls) -> CpuSplit | None:
        """The split ``$DVABATCH_CLIENT_CPUS`` asks for; None where it is unset or empty. The same
        text gives the same split all along, once this process has moved to its clients' CPUs too."""
        text = os.environ.get(CLIENT_CPUS, "").strip()
        return _split(text) if text else None

    @classmethod
    def parse(cls, text: str) -> CpuSplit:
        try:
            client = frozenset(cpu for part in text.split(",") for cpu in _cpu_range(part.strip()))
        except ValueError:
            raise ValueError(f"{CLIENT_CPUS}={text!r}: expected CPU numbers and ranges, e.g. 0 or 0-1 or 0,2") from None
        usable = frozenset(os.sched_getaffinity(0))
        if not client or not client <= usable:
            raise ValueError(f"{CLIENT_CPUS}={text!r}: this process may use CPUs {_spell(usable)} only")
        server = usable - client
        if not server:
            raise ValueError(f"{CLIENT_CPUS}={text!r} leaves no CPU to the server (this process may use "
                             f"{_spell(usable)})")
        return cls(client, server)

    def describe(self) -> str:
        return f"clients on CPUs {_spell(self.client)}, tritonserver and its stubs on {_spell(self.server)}"


@functools.cache
def _split(text: str) -> CpuSplit:
    return CpuSplit.parse(text)


def _cpu_range(part: str) -> range:
    first, _, last = part.partition("-")
    return range(int(first), int(last or first) + 1)


def _spell(cpus: frozenset[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def _processes() -> Iterator[tuple[int, str, int, int]]:
    """(pid, state, parent pid, process group) of every process (Linux ``/proc/<pid>/stat``)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state, ppid, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            except (OSError, ValueError):
                continue
            yield int(entry.name), state, int(ppid), int(pgrp)


def children_of(pid: int) -> dict[int, list[bytes]]:
    """The live child processes of ``pid``: child pid -> its command line arguments (Linux)."""
    found = {}
    for child, _, ppid, _ in _processes():
        if ppid == pid:
            try:
                found[child] = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
    return found


def resident_mb(pid: int) -> float:
    """Resident memory of process ``pid`` and its children (Triton's stubs), in MiB."""
    total = 0
    for process in [pid, *children_of(pid)]:
        try:
            total += next(int(line.split()[1]) for line in Path(f"/proc/{process}/status").read_text().splitlines()
                          if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError, IndexError):
            continue
    return total / 1024


def thread_switches(pid: int) -> int:
    """Times the threads of process ``pid`` alive now were switched out so far, voluntarily (to
    wait: a lock, a condition, a round trip) or not (0 once it is gone). A hand-off between two
    threads costs one each way: what a serving path's CPU per request does not show apart."""
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        try:
            total += sum(int(line.split()[1]) for line in (task / "status").read_text().splitlines()
                         if "ctxt_switches:" in line)
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total


def in_group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (Linux): a tritonserver started in a session of
    its own and its backend stubs, which stay in its group after it dies (reparented to init)."""
    return [pid for pid, state, _, pgrp in _processes() if pgrp == pgid and state != "Z"]


def how_it_ended(returncode: int) -> str:
    """A process's end in words: ``killed by SIGKILL`` or ``exited with status 1``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"
