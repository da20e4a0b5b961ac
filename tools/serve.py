"""Run a real tritonserver with the `dvabatch` backend, in the foreground.

    python -m tools.serve [--model-repository DIR] [--grpc-port P] [--http-port P]
                          [--metrics-port P] [--host ADDR] [--triton-home DIR] [-- TRITONSERVER-ARGS]

Unless told otherwise, every model of the repository is loaded at start under explicit model
control, so that a model whose backend stub died can be loaded again (``StubWatch``). If
tritonserver itself dies (the OOM killer), the backend stubs it leaves are ended (SIGKILL, by pid:
they ignore SIGTERM), the shared-memory regions it could not remove are removed, and this exits
with status 1 saying how it died, or, with ``--restart N``, starts it again up to N times. How the
server is assembled: ``tools/lib/triton.py``.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from tools.lib.paths import DEFAULT_REPOSITORY
from tools.lib.processes import how_it_ended
from tools.lib.triton import Server

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--triton-home", type=Path, help="use this Triton install (e.g. /opt/tritonserver)")
    parser.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for readiness")
    parser.add_argument("--restart", type=int, default=0, metavar="N",
                        help="start tritonserver again, up to N times, when it dies (default 0: exit non-zero)")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    if not any(a.startswith("--model-control-mode") for a in extra):
        # Every model loaded at start, as by default, and reloadable (a model whose stub died).
        extra = ["--model-control-mode=explicit", "--load-model=*", *extra]
    def on_signal(signum: int, _frame) -> None:
        raise KeyboardInterrupt

    # Both, explicitly: a process started in the background by a shell without job control
    # inherits SIGINT ignored, and Python then leaves it so (Ctrl-C, or `kill -INT`, did nothing).
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = None
    try:
        for attempt in range(args.restart + 1):
            server = Server(model_repository=args.model_repository, grpc_port=args.grpc_port,
                            http_port=args.http_port, metrics_port=args.metrics_port, host=args.host,
                            triton_home=args.triton_home, extra_args=extra)
            server.start(args.ready_timeout)
            print(f"dvabatch: Triton is ready. gRPC {server.grpc_url}, HTTP {args.host}:{args.http_port}, "
                  f"metrics http://{args.host}:{args.metrics_port}/metrics. Ctrl-C stops it.", flush=True)
            code, ended = server.outlive()
            regions = server.remove_regions()
            server.stop()
            again = attempt < args.restart
            print(f"dvabatch: tritonserver {how_it_ended(code)}; {len(ended)} backend stub(s) it left were ended "
                  f"and {len(regions)} shared-memory region(s) removed" + ("; starting it again" if again else ""),
                  file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("dvabatch: stopping Triton", flush=True)
        if server is not None:
            server.stop()
        return 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"dvabatch: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
