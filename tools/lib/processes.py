"""Processes and ports: a free port, a process's children and its resident memory (Linux)."""

from __future__ import annotations

import signal
import socket
from pathlib import Path


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_of(pid: int) -> dict[int, list[bytes]]:
    """The live child processes of ``pid``: child pid -> its command line arguments (Linux)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
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
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
                found.append(int(entry.name))
    return found


def how_it_ended(returncode: int) -> str:
    """A process's end in words: ``killed by SIGKILL`` or ``exited with status 1``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"
