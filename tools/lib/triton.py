"""A real tritonserver with the ``dvabatch`` backend: where it is installed, the backend folder it
is given, the process and its Python backend stubs (``Server``, ``StubWatch``).

Triton finds backends in one directory. We assemble it in a temporary folder: ``python/`` with
the Python backend (from the ``nvidia-pytriton`` wheel, with the stub built for the running
interpreter, from a GPU bundle, or from an installation) and ``dvabatch/`` linked to this
repository's ``backend/``. The stub embeds the first ``python3`` on PATH, so putting this
interpreter's bin folder first makes the project's virtualenv (onnxruntime, numpy...) visible to
the backend. If this process dies, even by SIGKILL, the kernel stops tritonserver too.
"""


from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from tools.lib.paths import BACKEND_DIR, DEFAULT_REPOSITORY
from tools.lib.processes import CLIENT_CPUS, CpuSplit, children_of, in_group

STOP_TIMEOUT_S = 30.0
SHARED_MEMORY = Path("/dev/shm")  # where the Python backend's regions live (Boost.Interprocess on Linux)
REGION_PREFIX = "dvabatch_"  # then the pid of the process that started tritonserver, its gRPC port and "_"
BACKENDS_PREFIX = "dvabatch-triton-"  # a server's backend folder in the temporary directory: then that pid and "-"


@dataclass(frozen=True)
class TritonInstall:
    """Where a tritonserver binary and its Python backend live."""

    binary: Path
    python_backend: Path  # folder with libtriton_python.so and triton_python_backend_utils.py
    stub: Path | None  # a stub to use instead of the one in python_backend
    libs: Path | None  # shared libraries the binary needs on LD_LIBRARY_PATH

    @classmethod
    def from_wheel(cls) -> TritonInstall:
        try:
            import pytriton
        except ImportError as exc:
            raise SystemExit("nvidia-pytriton is not installed: run `make setup` or pass --triton-home") from exc
        package = Path(pytriton.__file__).parent
        dist = package / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.is_file():
            raise SystemExit(f"nvidia-pytriton ships no Python backend stub for Python {version}")
        return cls(binary=dist / "bin" / "tritonserver", python_backend=dist / "backends" / "python",
                   stub=stub, libs=package.parent / "nvidia_pytriton.libs")

    @classmethod
    def from_home(cls, home: Path) -> TritonInstall:
        """A Triton installation (``/opt/tritonserver``), or the ``triton/`` folder of a GPU bundle
        (``tools.gpu_bundle``: the wheel's stub for this Python and its libraries in ``lib/``)."""
        binary, python_backend = home / "bin" / "tritonserver", home / "backends" / "python"
        for needed in (binary, python_backend):
            if not needed.exists():
                raise SystemExit(f"--triton-home {home}: {needed} does not exist")
        stub = home / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}" \
            / "triton_python_backend_stub"
        if (home / "python_backend_stubs").is_dir() and not stub.is_file():
            raise SystemExit(f"--triton-home {home}: no Python backend stub for this Python ({stub} is missing)")
        return cls(binary=binary, python_backend=python_backend, stub=stub if stub.is_file() else None,
                   libs=home / "lib" if (home / "lib").is_dir() else None)


def refuse_numpy_2() -> None:
    """The stubs in nvidia-pytriton 0.7 (Triton 24.10) were built against numpy 1: under numpy 2
    they read every input as garbage (zeros) and send empty outputs, without an error (seen on a
    GPU machine whose Python had numpy 2.5). The stubs run this process's Python unless
    ``Server.stub_python`` names another; the wheel asks for numpy<2, and this catches an
    environment where something upgraded it since, before any model loads (a model refuses to
    load in such a stub too: ``backend/model.py``)."""
    import numpy

    if int(numpy.__version__.split(".")[0]) >= 2:
        raise SystemExit(f"numpy {numpy.__version__} is installed, and the Python backend stubs of nvidia-pytriton "
                         "pass tensors wrong under numpy 2: pip install 'numpy<2' (or pass --triton-home with a "
                         "Triton built for numpy 2)")


def assemble_backends(install: TritonInstall, folder: Path) -> Path:
    """A backend directory holding `python` and `dvabatch`; returns its path."""
    backends = folder / "backends"
    python = backends / "python"
    python.mkdir(parents=True)
    for item in install.python_backend.iterdir():
        if item.name != "__pycache__" and not (install.stub and item.name == "triton_python_backend_stub"):
            # Copied, not linked: Triton refuses a backend library that resolves outside its folder.
            shutil.copy(item, python / item.name)
    if install.stub:
        shutil.copy(install.stub, python / "triton_python_backend_stub")
    (backends / "dvabatch").symlink_to(BACKEND_DIR, target_is_directory=True)
    return backends


def remove_orphans() -> list[Path]:
    """Remove what servers whose starting process no longer runs left behind (killed together
    with its tritonserver, neither could remove anything): their shared-memory regions and their
    backend folders, both named after that process's pid (``Server.region_prefix``,
    ``BACKENDS_PREFIX``); return them."""
    removed = _unlink(p for p in SHARED_MEMORY.glob(f"{REGION_PREFIX}*") if _gone(p.name[len(REGION_PREFIX):]))
    for folder in Path(tempfile.gettempdir()).glob(f"{BACKENDS_PREFIX}*"):
        if _gone(folder.name[len(BACKENDS_PREFIX):]):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _gone(named: str) -> bool:
    """Whether the pid ``named`` starts with (up to ``_`` or ``-``) is of no running process."""
    pid = re.split("[_-]", named, maxsplit=1)[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's: it runs
        pass
    return False


def _unlink(paths: Iterable[Path]) -> list[Path]:
    removed = []
    for path in paths:
        try:
            path.unlink()
            removed.append(path)
        except OSError:  # gone meanwhile, or another user's
            pass
    return removed


def _stop_with_parent(cpus: frozenset[int] | None = None) -> None:
    """In the child before exec: the kernel sends it SIGTERM when we die, even by SIGKILL, so a
    killed ``tools.serve`` never leaves a tritonserver holding the ports (Linux only); with
    ``cpus``, it runs on those."""
    import ctypes

    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: stop() still stops it on any ordinary exit
        pass




def stubs_of(server_pid: int) -> dict[int, str]:
    """The Python backend stubs of a tritonserver: pid -> the model it serves (from the stub's
    command line, whose first argument is ``<repository>/<model>/<version>/model.py``)."""
    return {child: Path(args[1].decode()).parent.parent.name for child, args in children_of(server_pid).items()
            if len(args) > 1 and args[0].endswith(b"triton_python_backend_stub")}


class StubWatch(threading.Thread):
    """Brings a model back when its Python backend stub dies (``kill -9``, the OOM killer).

    Triton 24.10 keeps calling such a model ready, answers each new request with "Stub process
    ... is not healthy" and never answers the requests that were in flight (their response
    senders died with the stub); loading it again is a no-op while it is loaded. Every
    ``interval_s`` the watch looks at the ready models that run in stubs (backend ``dvabatch``
    or ``python``, or any seen with a stub): one without a live stub is unloaded and loaded
    again through the repository API (explicit model control), which starts a fresh stub. A
    model being loaded or unloaded is not ready, and a reloaded one starts its new stub before
    the old one goes, so neither is touched."""

    STUB_BACKENDS = ("dvabatch", "python")

    def __init__(self, server_pid: int, url: str, interval_s: float = 1.0):
        super().__init__(name="dvabatch-stub-watch", daemon=True)
        self.server_pid, self.url, self.interval_s = server_pid, url, interval_s
        self._stopping = threading.Event()
        self._in_stubs: dict[str, bool] = {}  # model -> whether it runs in a stub

    def run(self) -> None:
        import tritonclient.grpc as grpcclient

        with grpcclient.InferenceServerClient(self.url) as client:
            while not self._stopping.wait(self.interval_s):
                try:
                    self._look(client)
                except Exception as exc:  # noqa: BLE001 - look again next time
                    print(f"dvabatch: could not check the backend stubs: {exc}", file=sys.stderr, flush=True)

    def _look(self, client) -> None:
        live = set(stubs_of(self.server_pid).values())
        self._in_stubs.update(dict.fromkeys(live, True))
        index = client.get_model_repository_index(as_json=True).get("models", [])
        for model in sorted({m["name"] for m in index if m.get("state") == "READY"} - live):
            if model not in self._in_stubs:
                backend = client.get_model_config(model, as_json=True)["config"].get("backend", "")
                self._in_stubs[model] = backend in self.STUB_BACKENDS
            if self._in_stubs[model] and model not in stubs_of(self.server_pid).values():
                print(f"dvabatch: the backend stub of model '{model}' died; loading it again",
                      file=sys.stderr, flush=True)
                client.unload_model(model)
                client.load_model(model)

    def stop(self) -> None:
        self._stopping.set()
        self.join(10)


@dataclass
class Server:
    """A tritonserver process; use as a context manager or call start()/stop()."""

    model_repository: Path = DEFAULT_REPOSITORY
    grpc_port: int = 8001
    http_port: int = 8000
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    triton_home: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    log: Path | None = None  # server output goes here; None: inherit stdout/stderr
    watch_stubs: bool = True  # reload a model whose stub died (needs explicit model control; see StubWatch)
    # The Python whose packages the backend stubs import: they ignore PYTHONPATH and start from the
    # first python3 on tritonserver's PATH (its virtualenv included). None: this process's.
    stub_python: Path | None = None
    process: subprocess.Popen | None = field(default=None, init=False)
    _watch: StubWatch | None = field(default=None, init=False)
    _folder: Path | None = field(default=None, init=False)
    _output: object = field(default=None, init=False)

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def backends(self) -> Path:
        """The backend directory it was started with: a backend linked into it loads with the
        first model that names it (``tools.bench_versions`` serves another checkout's so)."""
        if self._folder is None:
            raise RuntimeError("tritonserver has not been started")
        return self._folder / "backends"

    def command(self, backends: Path) -> list[str]:
        install = self._install()
        return [
            str(install.binary),
            f"--model-repository={Path(self.model_repository).resolve()}",
            f"--backend-directory={backends}",
            f"--grpc-port={self.grpc_port}", f"--grpc-address={self.host}",
            f"--http-port={self.http_port}", f"--http-address={self.host}",
            f"--metrics-port={self.metrics_port}", f"--metrics-address={self.host}",
            # A unique shared-memory prefix, so that several servers can run on one machine.
            f"--backend-config=python,shm-region-prefix-name={self.region_prefix}",
            *self.extra_args,
        ]

    @property
    def region_prefix(self) -> str:
        """How the Python backend's shared-memory regions of this server begin (one region a
        stub): this process's pid and the gRPC port make it unique on the host."""
        return f"{REGION_PREFIX}{os.getpid()}_{self.grpc_port}_"

    def remove_regions(self) -> list[Path]:
        """Unlink this server's shared-memory regions left in /dev/shm, once it and its stubs
        are gone; return them. tritonserver removes a stub's region when it stops, but not when
        it is killed (the OOM killer's SIGKILL): each region keeps at least its default size (1
        MiB) and as much as the model's largest tensors took, in RAM, until the host reboots, and
        a container's /dev/shm is small (64 MiB by default under Docker). A stub still running
        would keep its mapping: an unlinked file lives on until the last one ends."""
        return _unlink(SHARED_MEMORY.glob(f"{self.region_prefix}*"))

    def _install(self) -> TritonInstall:
        """``triton_home``, else ``$DVABATCH_TRITON_HOME``, else the nvidia-pytriton wheel's."""
        home = self.triton_home or os.environ.get("DVABATCH_TRITON_HOME")
        install = TritonInstall.from_home(Path(home)) if home else TritonInstall.from_wheel()
        if install.stub is not None:  # the wheel's stubs, here or carried in a bundle
            refuse_numpy_2()
        return install

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{Path(self.stub_python or sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        libs = self._install().libs
        if libs:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (env.get("LD_LIBRARY_PATH"), str(libs)) if p)
        return env

    def start(self, ready_timeout_s: float = 180.0) -> Server:
        """Start tritonserver and return once it is ready, or raise with its exit status. Where
        ``$DVABATCH_CLIENT_CPUS`` splits the host (``processes.CpuSplit``), tritonserver (and the
        stubs it starts) runs on the server's CPUs and this process moves to the clients', where
        the perf_analyzer runs it starts inherit them."""
        split = CpuSplit.from_env()
        remove_orphans()
        self._folder = Path(tempfile.mkdtemp(prefix=f"{BACKENDS_PREFIX}{os.getpid()}-"))
        backends = assemble_backends(self._install(), self._folder)
        self._output = open(self.log, "ab") if self.log else None  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            self.command(backends), env=self._env(), stdout=self._output,
            stderr=subprocess.STDOUT if self._output else None,
            start_new_session=True,  # its own process group: we stop it and its stubs together
            preexec_fn=_stop_with_parent if split is None else lambda: _stop_with_parent(split.server),
        )
        if split is not None:
            os.sched_setaffinity(0, split.client)
            print(f"dvabatch: {split.describe()} ({CLIENT_CPUS})", file=sys.stderr)
        try:
            self.wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        if self.watch_stubs and "--model-control-mode=explicit" in self.extra_args:
            self._watch = StubWatch(self.process.pid, self.grpc_url)
            self._watch.start()
        return self

    def wait_ready(self, timeout_s: float) -> None:
        import tritonclient.grpc as grpcclient

        deadline = time.monotonic() + timeout_s
        with grpcclient.InferenceServerClient(self.grpc_url) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"tritonserver exited with status {self.process.returncode} before it was ready"
                                       + (f"; see {self.log}{self._errors()}" if self.log else ""))
                try:
                    if client.is_server_ready():
                        return
                except Exception:  # noqa: BLE001 - not listening yet
                    pass
                time.sleep(0.25)
        raise TimeoutError(f"tritonserver was not ready within {timeout_s:.0f} s")

    def _errors(self, most: int = 5) -> str:
        """The log's last error lines (Triton's start with ``E``), for a log in a scratch folder
        that is gone by the time anyone reads the message. A log without one (tritonserver refusing
        its command line, or ending before it logs) gives its first line and its last ones, ``most``
        in all: once a fresh clone's soak saw tritonserver exit 1 with no error line, and the
        message said nothing more."""
        try:
            lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return ""
        errors = [line for line in lines if line.startswith("E")][-most:]
        if not errors:
            errors = lines[:1] + lines[max(1, len(lines) - most + 1):]
        return "".join(f"\n  {line}" for line in errors)

    def outlive(self) -> tuple[int, list[int]]:
        """Wait until tritonserver ends, end the stubs it left (``end_stubs``), and only then reap
        it; return its exit status and the pids ended. Each stub looks every 300 ms whether its
        parent's pid still exists and, once that is reaped, exits on its own ("Non-graceful
        termination detected"), unlinking its region as it goes: reaping first raced the stubs,
        and which regions were left to remove depended on the scheduler. An unreaped
        tritonserver still exists for them, so they are ended before they can look."""
        if self.process is None:
            raise RuntimeError("tritonserver has not been started")
        os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOWAIT)
        ended = self.end_stubs()
        return self.process.wait(), ended

    def end_stubs(self) -> list[int]:
        """SIGKILL whatever is left of tritonserver's process group, by pid (tritonserver itself
        if it still runs): its Python backend stubs outlive a tritonserver that was killed (the
        OOM killer's SIGKILL), keep their models' memory and ignore SIGTERM. Returns the pids
        ended."""
        left = in_group(self.process.pid) if self.process is not None else []
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left

    def stop(self) -> int | None:
        """Stop gracefully (SIGTERM), then make sure no server or stub process is left."""
        code = None
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pass
            self.end_stubs()  # tritonserver too, if it outlived the grace period
            code = self.process.wait()
            self.remove_regions()
        if self._output is not None:
            self._output.close()
            self._output = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        return code

    def __enter__(self) -> Server:
        return self.start() if self.process is None else self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
