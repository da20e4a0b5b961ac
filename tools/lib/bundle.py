"""The archive for a GPU host without network (``python -m tools.gpu_bundle``; what it holds is
said there)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from tools.lib.paths import CACHE, ROOT, SOURCES
from tools.lib.workload import GLUE_DIR

LIMIT = 64 * 2**20  # what travels to a lent GPU machine: the working tree and the bundle together
# What the working tree may take of LIMIT: the bundle without the project was 49.4 MiB on
# 2026-12-02 (tritonserver, perf_analyzer and numpy's wheel are most of it), and a session that
# cannot carry both loses its device time. The results' plots are saved in a palette for it
# (``tools.compare.output.save_png``).
TREE_BUDGET = 12 * 2**20
TOP = "dvabatch-gpu"
HOST_SCRIPT = ROOT / "tools" / "gpu_host.sh"
GLUE_TASKS = ("RTE", "SST-2")
# Wheels for the host's Python beside these two: the tritonclient and protobuf that run here.
NUMPY = "numpy==1.26.4"
RAPIDJSON = "python-rapidjson==1.25"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


class BundleError(RuntimeError):
    """What could not be put in the bundle, in one line."""


def _installed(name: str) -> str:
    from importlib.metadata import version

    return f"{name}=={version(name)}"


def wheels(python: str) -> list[Path]:
    """The wheels the host installs, downloaded once for ``python`` into the cache."""
    folder = CACHE / "wheels" / f"gpu-py{python}"
    folder.mkdir(parents=True, exist_ok=True)
    wanted = [NUMPY, RAPIDJSON, _installed("tritonclient"), _installed("protobuf")]
    found = []
    for requirement in wanted:
        name, version = requirement.split("==")
        stem = f"{name.replace('-', '_')}-{version}-"
        have = [w for w in folder.glob("*.whl") if w.name.lower().startswith(stem.lower())]
        if not have:
            platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                                   "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
                                   *platforms, "--dest", str(folder), requirement], capture_output=True, text=True)
            have = [w for w in folder.glob("*.whl") if w.name.lower().startswith(stem.lower())]
            if done.returncode != 0 or not have:
                raise BundleError(f"pip could not download {requirement} for Python {python}: "
                                  f"{(done.stderr.strip().splitlines() or ['no wheel'])[-1]}")
        found.append(have[0])
    return found


def _needed(path: Path) -> list[str]:
    """The shared libraries an ELF file names (DT_NEEDED), read with binutils' readelf."""
    if shutil.which("readelf") is None:
        raise BundleError("readelf (binutils) is needed to find the libraries tritonserver loads")
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line]


def triton_files(python: str) -> dict[str, Path]:
    """Archive name -> file: tritonserver, the Python backend, the stub for ``python``, the local
    cache and every library of the wheel they load, directly or through each other."""
    try:
        import pytriton
    except ImportError as exc:
        raise BundleError("nvidia-pytriton is not installed: run `make setup`") from exc
    package = Path(pytriton.__file__).parent
    dist, libs = package / "tritonserver", package.parent / "nvidia_pytriton.libs"
    stub = dist / "python_backend_stubs" / python / "triton_python_backend_stub"
    if not stub.is_file():
        raise BundleError(f"nvidia-pytriton ships no Python backend stub for Python {python}")
    files = {
        "triton/bin/tritonserver": dist / "bin" / "tritonserver",
        "triton/backends/python/libtriton_python.so": dist / "backends" / "python" / "libtriton_python.so",
        "triton/backends/python/triton_python_backend_utils.py":
            dist / "backends" / "python" / "triton_python_backend_utils.py",
        f"triton/python_backend_stubs/{python}/triton_python_backend_stub": stub,
        "triton/caches/local/libtritoncache_local.so": dist / "caches" / "local" / "libtritoncache_local.so",
    }
    pending, bundled = [path for path in files.values() if path.suffix != ".py"], set()
    while pending:
        for name in _needed(pending.pop()):
            if (libs / name).is_file() and name not in bundled:
                bundled.add(name)
                pending.append(libs / name)
    return {**files, **{f"triton/lib/{name}": libs / name for name in sorted(bundled)}}


def perf_analyzer_files() -> dict[str, Path]:
    from tools.lib.perf_analyzer import binary

    wrapper = binary()  # installed by make setup, or an error saying how
    folder = wrapper.parent.parent / "lib" / "perf_analyzer"
    return {"perf_analyzer/bin/perf_analyzer": wrapper,
            **{f"perf_analyzer/lib/perf_analyzer/{f.name}": f for f in sorted(folder.iterdir())}}


def project_files() -> dict[str, Path]:
    """The repository's files as they are in the working tree: tracked ones and new ones git does
    not ignore (what a clone of the next commit would hold)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout
    names = [n for n in listed.decode().split("\0") if n and (ROOT / n).is_file()]
    return {f"project/{name}": ROOT / name for name in names}


def data_files() -> dict[str, Path]:
    files = {}
    for task in GLUE_TASKS:
        dev = GLUE_DIR / task / "dev.tsv"
        if not dev.is_file():
            raise BundleError(f"{dev} is missing (GLUE, see DVABATCH_GLUE)")
        files[f"glue/{task}/dev.tsv"] = dev
    if (GLUE_DIR / "SOURCES.md").is_file():
        files["glue/SOURCES.md"] = GLUE_DIR / "SOURCES.md"
    tokenizer = SOURCES / "minilm.tokenizer.json"
    if tokenizer.is_file():
        files["tokenizer.json"] = tokenizer
    return files


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "HEAD") + (" (with uncommitted changes)" if git("status", "--porcelain") else "")


def bundle_files(python: str, project: bool = True) -> dict[str, Path]:
    """Archive name -> file: everything the host needs for ``python``, with or without the project
    (where a checkout travels beside the bundle, as the working tree does to a lent machine)."""
    return {**triton_files(python), **perf_analyzer_files(), **{f"wheels/{w.name}": w for w in wheels(python)},
            **data_files(), **(project_files() if project else {}), "host.sh": HOST_SCRIPT}


def build(out: Path, python: str, project: bool = True) -> dict[str, int]:
    """Write the archive ``out``; archive name -> bytes (before compression)."""
    files = bundle_files(python, project)
    sizes = {name: path.stat().st_size for name, path in files.items()}
    listing = "".join(f"{size:>12}  {name}\n" for name, size in sorted(sizes.items()))
    about = (f"dvabatch GPU bundle: python -m tools.gpu_bundle --python {python}{'' if project else ' --no-project'}\n"
             f"commit {_commit()}\nbuilt {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\npython {python}\n\n"
             f"{sum(sizes.values())} bytes in {len(sizes)} files:\n{listing}").encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(partial, "w:xz", preset=6) as archive:
        for name, path in sorted(files.items()):
            info = archive.gettarinfo(str(path), f"{TOP}/{name}")
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with path.open("rb") as data:
                archive.addfile(info, data)
        info = tarfile.TarInfo(f"{TOP}/BUNDLE.txt")
        info.size, info.mode, info.mtime = len(about), 0o644, int(time.time())
        archive.addfile(info, io.BytesIO(about))
    partial.replace(out)
    tree = 0 if project else tree_bytes()  # a bundle without the project travels beside the tree
    if out.stat().st_size + tree > LIMIT:
        beside = f" with the working tree's {tree / 2**20:.1f} MiB beside it" if tree else ""
        raise BundleError(f"{out} is {out.stat().st_size / 2**20:.1f} MiB{beside}: more than the {LIMIT // 2**20} "
                          "MiB that travel to a GPU machine")
    return sizes


def tree_bytes() -> int:
    """The bytes of the working tree a lent GPU machine is given (``project_files``)."""
    return sum(path.stat().st_size for path in project_files().values())
