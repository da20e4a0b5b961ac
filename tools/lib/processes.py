"""Processes and ports: a free port, a process's children and its resident memory (Linux)."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
