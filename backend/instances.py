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
stubs' parent) and the model; the leader holds a lock on it while it lives (the kernel lets go of
it when its process ends), and an instance that follows tries to take it once a window, so that
a leader that unloaded or died is replaced: two lives of a model loaded one after another had
each instance take the lead of a file the one before left, and both decide (two trials of plain
at once).
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
FOLLOW_POLL_S = 0.02  # how often an instance that follows reads the way to serve
SHARED = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
WIDTH = 16  # the way is written padded to this, in one write in place: a reader sees the old or the new


@dataclass
class SharedMode:
    """The file through which a model's instances serve one way: the instance that holds its lock
    (``leads``) writes it, the others read it."""

    path: Path
    fd: int | None = None  # the locked file, while this instance leads

    @classmethod
    def of(cls, model: str, instances: int, folder: Path = SHARED) -> SharedMode | None:
        """This instance's part (None for a model with one instance, or where ``folder`` takes no
        file: each instance then decides for itself, as the log says), leading where it takes
        the lock."""
        if instances <= 1:
            return None
        shared = cls(folder / f"dvabatch-{os.getppid()}-{model}.mode")
        try:
            shared.elect()
        except OSError as exc:
            log.warning("%s: its %d instances decide how to serve each on its own: %s", model, instances, exc)
            return None
        return shared

    @property
    def leads(self) -> bool:
        return self.fd is not None

    def elect(self) -> bool:
        """Take the lead where no live instance holds it (the file made where there is none);
        whether this instance leads."""
        if self.fd is not None:
            return True
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # ... of the file the path names still: a leader unloading unlinks its file, then lets go
            held = self._names(fd)
        except (BlockingIOError, FileNotFoundError):
            held = False
        if not held:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def _names(self, fd: int) -> bool:
        """Whether the path still names the file open at ``fd`` (not one made after it was unlinked)."""
        return os.stat(self.path).st_ino == os.fstat(fd).st_ino

    def write(self, mode: str) -> None:
        """Where it leads: ``mode`` is the way every instance serves from now on."""
        if self.fd is None:
            return
        try:
            os.pwrite(self.fd, f"{mode:<{WIDTH}}".encode(), 0)
        except OSError:  # the others go on serving the way they last read
            log.exception("could not tell the model's other instances to serve %s", mode)

    def read(self) -> str | None:
        """The way the leading instance serves (None before it has said, or where the file cannot
        be read)."""
        try:
            return self.path.read_text().strip() or None
        except OSError:
            return None

    def close(self) -> None:
        """The leading instance unloads: the file goes with it (where it is still this one's)."""
        if self.fd is None:
            return
        try:
            if self._names(self.fd):
                self.path.unlink()
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
