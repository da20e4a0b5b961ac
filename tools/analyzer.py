"""python -m tools.analyzer: Triton's Model Analyzer sweeps dvabatch models like any Triton model.

    python -m tools.analyzer MODEL_DIR [MODEL_DIR ...] --out DIR [--dataset glue:RTE --tokenizer FILE |
        --input-data FILE | --shape NAME:D1,D2 | --lengths L1,L2] [--concurrency 1,4,16]
        [--sweep policy=auto,pass] [--sweep buffer_pairs=2,3] [--max-batch-size 4,8] [--write-only]
        [-- MODEL-ANALYZER-ARGS]

``model-analyzer profile`` (``make analyzer`` installs version 1.58) launches the tritonserver of
the ``nvidia-pytriton`` wheel itself (``--triton-launch-mode local``), writes one model config per
point of the sweep, loads each and measures it with perf_analyzer at every ``--concurrency``. This
command prepares what it cannot find by itself and then runs it:

- ``DIR/repository``: the sliced models (give several slicings of one source, e.g. 2 and 4
  stages, to sweep the stage count: each is its own model);
- ``DIR/backends``: the backend directory Triton needs, ``python/`` from the wheel with the stub of
  this interpreter and ``dvabatch/`` linked to ``backend/``;
- ``DIR/data.json``: perf_analyzer's input data (GLUE text at its own lengths, or synthetic);
- ``DIR/config.yaml``: Model Analyzer's config: the server's path, flags and environment, and
  ``model_config_parameters`` sweeping config.pbtxt ``parameters`` (``--sweep``) and
  ``max_batch_size``.

Model Analyzer writes its reports and metrics CSVs to ``DIR/export``; ``--write-only`` stops
before running it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from tools.lib.cli import numbers
from tools.lib.peers import link_version
from tools.lib.perf_analyzer import PerfAnalyzerError, binary
from tools.lib.triton import TritonInstall, assemble_backends, refuse_numpy_2
from tools.lib.workload import WorkloadError, add_workload_arguments, from_arguments, interface_of, write_input_data

VERSION_PINNED = "1.58.0"


def _sweep(text: str) -> tuple[str, list[str]]:
    key, sep, values = text.partition("=")
    if not sep or not key or not values:
        raise argparse.ArgumentTypeError(f"expected KEY=V1,V2,..., got {text!r}")
    return key, values.split(",")


def config(models: list[str], out: Path, data: str, concurrency: list[int], sweeps: dict[str, list[str]],
           max_batch_sizes: list[int], install: TritonInstall) -> dict:
    """Model Analyzer's profile config for ``models`` of ``out/repository``."""
    environment = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"}
    if install.libs:
        environment["LD_LIBRARY_PATH"] = str(install.libs)
    parameters = {}
    if sweeps:
        parameters["parameters"] = {key: {"string_value": values} for key, values in sweeps.items()}
    if max_batch_sizes:
        parameters["max_batch_size"] = max_batch_sizes
    return {
        "model_repository": str(out / "repository"),
        "output_model_repository_path": str(out / "output_repository"),
        "override_output_model_repository": True,
        "export_path": str(out / "export"),
        "checkpoint_directory": str(out / "checkpoints"),
        "triton_launch_mode": "local",
        "triton_server_path": str(install.binary),
        "triton_server_flags": {"backend_directory": str(out / "backends")},
        "triton_server_environment": environment,
        "perf_analyzer_path": str(binary()),
        "run_config_search_disable": True,
        "profile_models": {model: {"perf_analyzer_flags": {"input-data": data},
                                   "parameters": {"concurrency": concurrency},
                                   **({"model_config_parameters": parameters} if parameters else {})}
                           for model in models},
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m tools.analyzer", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dirs", type=Path, nargs="+", help="model directories written by python -m slicer")
    p.add_argument("--out", type=Path, required=True, help="folder for everything Model Analyzer reads and writes")
    add_workload_arguments(p)
    p.add_argument("--concurrency", type=numbers(int), default="1,4,16",
                   help="perf_analyzer concurrencies (default 1,4,16)")
    p.add_argument("--sweep", type=_sweep, action="append", default=[], metavar="KEY=V1,V2",
                   help="a config.pbtxt parameter and the values to sweep (e.g. policy=auto,pass)")
    p.add_argument("--max-batch-size", type=numbers(int, empty=True), default="",
                   help="max_batch_size values to sweep (e.g. 4,8)")
    p.add_argument("--write-only", action="store_true", help="write the repository and config, do not profile")
    args = p.parse_args(argv)
    concurrency, max_batch_sizes = list(args.concurrency), list(args.max_batch_size)
    analyzer = shutil.which("model-analyzer", path=str(Path(sys.executable).parent)) or shutil.which("model-analyzer")
    if analyzer is None and not args.write_only:
        print("error: model-analyzer is not installed: run `make analyzer` (triton-model-analyzer "
              f"{VERSION_PINNED})", file=sys.stderr)
        return 2
    try:
        refuse_numpy_2()
        install = TritonInstall.from_wheel()
        shutil.rmtree(args.out / "repository", ignore_errors=True)
        shutil.rmtree(args.out / "backends", ignore_errors=True)
        for model_dir in args.model_dirs:
            link_version(model_dir, args.out / "repository" / model_dir.name)
            shutil.copy(model_dir / "config.pbtxt", args.out / "repository" / model_dir.name / "config.pbtxt")
        assemble_backends(install, args.out)
        if args.input_data not in ("random", "zero") and not args.dataset:
            data = str(Path(args.input_data).resolve())
        else:
            data = str(write_input_data(from_arguments(args, interface_of(args.model_dirs[0])), args.out / "data.json"))
        settings = config([m.name for m in args.model_dirs], args.out.resolve(), data, concurrency,
                          dict(args.sweep), max_batch_sizes, install)
    except (WorkloadError, PerfAnalyzerError, FileNotFoundError, ValueError, SystemExit) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path = args.out / "config.yaml"
    path.write_text(json.dumps(settings, indent=2) + "\n")  # JSON is YAML
    print(f"wrote {path}, {args.out / 'repository'} and {args.out / 'backends'}")
    if args.write_only:
        return 0
    command = [analyzer, "profile", "-f", str(path), *extra]
    print("running " + " ".join(command), flush=True)
    return subprocess.run(command, cwd=args.out).returncode


if __name__ == "__main__":
    sys.exit(main())
