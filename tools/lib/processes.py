"""Processes and ports: a free port, a process's children and its resident memory (Linux)."""

from __future__ import annotations

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
