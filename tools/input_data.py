"""python -m tools.input_data: perf_analyzer's ``--input-data`` JSON from real text or synthetic shapes.

    python -m tools.input_data MODEL_DIR -o rte.json --dataset glue:RTE --tokenizer tokenizer.json
        [--max-length 128] [--pad-to 128]
    python -m tools.input_data -m MODEL [-u localhost:8001] -o data.json [--input-data zero]
        [--shape NAME:D1,D2] [--lengths 16,64,128] [--count 64]

The model's inputs come from a sliced model directory (its manifest) or from a running server
(``-m``, ``-u``). One entry per query, each input with its own shape, so that perf_analyzer sends
every GLUE example at its own length (``--pad-to``: the client pads them all to one length)::

    perf_analyzer -m minilm -i grpc --input-data rte.json --request-rate-range 30 \\
        --request-distribution poisson
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.lib.workload import (
    ModelInterface, WorkloadError, interface_of, add_workload_arguments, from_arguments, write_input_data,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.input_data", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", type=Path, nargs="?", help="a model directory written by python -m slicer")
    p.add_argument("-m", dest="model", help="or: a model served at -u")
    p.add_argument("-u", dest="url", default="localhost:8001", help="gRPC address (default localhost:8001)")
    p.add_argument("-o", dest="out", type=Path, required=True, help="the JSON file to write")
    p.add_argument("--pad-to", type=int, help="--dataset: the client pads every query to this many tokens")
    add_workload_arguments(p)
    args = p.parse_args(argv)
    if (args.model_dir is None) == (args.model is None):
        p.error("give a model directory or -m MODEL")
    try:
        model = interface_of(args.model_dir) if args.model_dir else ModelInterface.from_server(args.url, args.model)
        requests = from_arguments(args, model, args.pad_to)
    except (WorkloadError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - tritonclient raises its own kinds
        print(f"error: cannot read model '{args.model}' at {args.url}: {exc}", file=sys.stderr)
        return 2
    write_input_data(requests, args.out)
    lengths = sorted(r.length for r in requests if r.length is not None)
    print(f"wrote {args.out}: {len(requests)} queries" + (f", lengths {lengths[0]}-{lengths[-1]} (median "
                                                          f"{lengths[len(lengths) // 2]})" if lengths else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
