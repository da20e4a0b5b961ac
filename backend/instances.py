"""One way of serving for all of a model's instances, decided by one of them.

Triton hands a model's calls to whichever of its instances is free, from one queue. An instance
serving pipelined returns from ``execute`` at once and takes the next call; one serving plain
holds its call until the batch is answered. So where each instance's mode switch decides for
itself, an instance's windows show its share of the load, and that share moves with the other
instances' ways: two instances of the slower engine at 16 in flight each tried plain on its own,
the one serving plain answered 121/s while the other, still pipelined, took 465/s, and trials
read as loads that moved or were refused against a pipeline that took their requests, 21 trials
in one check, 0.80x the forced pipeline in one life (docs/results/instances-two). Here the
instance that loads first decides (it ``leads``) and writes each way it takes to a small file the
others read every ``FOLLOW_POLL_S``: every instance serves the same way within that, and a
trial's windows show a way served by all. The file is named after tritonserver's process (the
stubs' parent) and the model; an instance loaded again after its stub died takes the lead where
the process that held it is gone.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
FOLLOW_POLL_S = 0.02  # how often an instance that follows reads the way to serve
SHARED = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


@dataclass
class SharedMode:
    """The file through which a model's instances serve one way: ``leads`` for the instance that
    writes it, the others read it."""

    path: Path
    leads: bool
    pid: int

    @classmethod
    def of(cls, model: str, instances: int, folder: Path = SHARED, pid: int | None = None) -> SharedMode | None:
        """This instance's part (None for a model with one instance, or where ``folder`` takes no
        file: each instance then decides for itself, as the log says): the first to create the
        file leads, as does one that finds it held by a process that is gone."""
        if instances <= 1:
            return None
        pid = os.getpid() if pid is None else pid
        path = folder / f"dvabatch-{os.getppid()}-{model}.mode"
        try:
            with os.fdopen(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600), "w") as file:
                file.write(f"{pid} \n")
            return cls(path, True, pid)
        except FileExistsError:
            holder = _holder(path)
            shared = cls(path, holder is None or holder == pid or not _alive(holder), pid)
            if shared.leads:
                shared.write("")
            return shared
        except OSError as exc:
            log.warning("%s: its %d instances decide how to serve each on its own: %s", model, instances, exc)
            return None

    def write(self, mode: str) -> None:
        """Where it leads: ``mode`` is the way every instance serves from now on."""
        if not self.leads:
            return
        staged = self.path.with_name(f"{self.path.name}.{self.pid}")
        try:
            staged.write_text(f"{self.pid} {mode}\n")
            os.replace(staged, self.path)
        except OSError:  # the others go on serving the way they last read
            log.exception("could not tell the model's other instances to serve %s", mode)

    def read(self) -> str | None:
        """The way the leading instance serves (None before it has said, or where the file cannot
        be read)."""
        try:
            _, _, mode = self.path.read_text().strip().partition(" ")
        except OSError:
            return None
        return mode or None

    def close(self) -> None:
        """The leading instance unloads: the file goes with it."""
        if self.leads and _holder(self.path) == self.pid:
            self.path.unlink(missing_ok=True)


def _holder(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
