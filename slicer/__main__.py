"""python -m slicer SRC.onnx --stages N --out DIR [options]: profile, cut, build, verify, measure.

Exit status 0 when the model was written, 2 when the model, an option or --out cannot be used
(one line says why; nothing is left behind), 130 when stopped by Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from backend.decide import choose
from backend.host import Machine
from slicer.errors import SliceError
from slicer.slicing import AUTO, SliceOptions, SliceResult, slice_model
from slicer.targets import OPTIMIZATION_LEVELS, TARGETS
from slicer.triton_config import on_gpu


def _dim(text: str) -> tuple[str, int]:
    name, _, size = text.partition("=")
    if not name or not size.isdigit() or int(size) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=SIZE with SIZE >= 1, got {text!r}")
    return name, int(size)


def _stages(text: str) -> int | str:
    if text == AUTO:
        return AUTO
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a number of stages (1 or more) or 'auto', got {text!r}")
    return int(text)


def _lengths(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes such as 16,32,64, got {text!r}") from None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        """A bad option is one line, as every other refusal (argparse prints its usage first)."""
        self.exit(2, f"error: {message} (python -m slicer --help lists the options)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m slicer",
        description="Profile an ONNX model, cut it into time-balanced stages and write a Triton model "
                    "directory for the dvabatch backend.",
    )
    p.add_argument("src", type=Path, help="the source ONNX model (first axis of every input dynamic)")
    p.add_argument("--out", type=Path, required=True, help="model directory to write; its name is the model name")
    p.add_argument("--stages", type=_stages, help="number of stages, or 'auto' to choose it from the profile "
                                                  "(default with --cut-at-diversity: one per diversity run)")
    p.add_argument("--max-batch-size", type=int, default=8, help="Triton max_batch_size (default 8)")
    p.add_argument("--target", choices=TARGETS, default="onnxruntime",
                   help="onnxruntime: ONNX files for CPU instances (default); torch: ONNX files run by torch on "
                        "--device; tensorrt: one engine per stage for GPU instances")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="torch: where the stages are profiled and served (default auto: a GPU torch sees, "
                        "else the CPU)")
    p.add_argument("--optimize", choices=OPTIMIZATION_LEVELS,
                   help="ONNX Runtime graph optimisation before cutting (default: extended for onnxruntime, "
                        "basic for torch and tensorrt)")
    p.add_argument("--precision", choices=("fp32", "tf32", "fp16"), default="fp32",
                   help="torch and tensorrt: fp32 (default; TF32 off), tf32, or fp16 (weights in half; the stages "
                        "must agree with the FP32 source to --min-cosine)")
    p.add_argument("--dim", type=_dim, action="append", default=[], metavar="NAME=SIZE",
                   help="size of a named dynamic axis other than the length axis (default 8)")
    p.add_argument("--length-axis", default=AUTO, metavar="NAME",
                   help="input axis whose padded length varies (default: the inputs' only named axis; 'none')")
    p.add_argument("--lengths", type=_lengths, default=(16, 32, 64), metavar="L1,L2,...",
                   help="padded lengths to profile along the length axis (default 16,32,64)")
    p.add_argument("--balance-batch-size", type=int,
                   help="batch size whose stage times are balanced (default: the maximum)")
    p.add_argument("--balance-slack", type=float, default=0.05,
                   help="cut sets whose slowest stage is within this fraction of the best count as ties, "
                        "and the one moving fewest bytes wins (default 0.05; 0 = strictly fastest)")
    p.add_argument("--cut-at-diversity", action="store_true",
                   help="cut where the nodes' preferred batch size changes (operator diversity)")
    p.add_argument("--improvement", type=float, default=0.10,
                   help="a larger batch is preferred only if it cuts time per query by this fraction (default 0.1)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs per configuration (default 3)")
    p.add_argument("--node-repeats", type=int, default=10, help="profiled runs per configuration (default 10)")
    p.add_argument("--stage-repeats", type=int, default=30,
                   help="timed runs per stage and configuration for the latency tables (default 30)")
    p.add_argument("--no-policy-defaults", dest="policy_defaults", action="store_false",
                   help="write no policy parameters into config.pbtxt (the backend's defaults apply)")
    p.add_argument("--calibration-rounds", type=int, default=3,
                   help="times the cuts are measured as served and re-cut from those times (default 3; "
                        "0: cut from the node profile alone)")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="fp32: largest absolute difference allowed between stages and source (default 1e-4)")
    p.add_argument("--min-cosine", type=float, default=0.999,
                   help="tf32 and fp16: least cosine similarity allowed between the stages' outputs and the "
                        "source's (default 0.999)")
    return p


def options_from(args: argparse.Namespace) -> SliceOptions:
    return SliceOptions(
        stages=args.stages, max_batch_size=args.max_batch_size, target=args.target, optimize=args.optimize,
        dim_sizes=dict(args.dim), length_axis=None if args.length_axis == "none" else args.length_axis,
        lengths=args.lengths, balance_batch_size=args.balance_batch_size, balance_slack=args.balance_slack,
        cut_at_diversity=args.cut_at_diversity, improvement=args.improvement, warmup=args.warmup,
        node_repeats=args.node_repeats, stage_repeats=args.stage_repeats, tolerance=args.tolerance,
        min_cosine=args.min_cosine, precision=args.precision, device=args.device, policy_defaults=args.policy_defaults,
        calibration_rounds=args.calibration_rounds,
    )


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def summary(result: SliceResult, console: Console) -> None:
    manifest, report = result.manifest, result.manifest.slicing
    at = f" (length {report.balance_length})" if report.length_axis else ""
    table = Table(title=f"{result.model_dir.name}: {len(manifest.stages)} stages, {report.target}, "
                        f"graph optimisation {report.optimization}")
    max_bs = manifest.max_batch_size
    for column in ("stage", "nodes", "first … last node", "ms @1", f"ms @{max_bs}", f"p99 @{max_bs}",
                   "preferred bs", f"buffer @{max_bs}", "carried"):
        table.add_column(column, overflow="fold", justify="left" if column in ("first … last node", "carried")
                         else "right")
    for stage, predicted in zip(manifest.stages, result.plan.stage_costs):
        mean = stage.latency.row(report.balance_length)
        p99 = stage.latency.row(report.balance_length, "p99")
        table.add_row(str(stage.index), str(stage.nodes), " … ".join(stage.node_range), f"{mean[0]:.3f}",
                      f"{mean[-1]:.3f}", f"{p99[-1]:.3f}", str(stage.preferred_batch_size),
                      _size(stage.buffer_bytes), ", ".join(stage.carry) or "-")
    console.print(table)
    console.print(f"balance (slowest / mean stage) at batch size {report.balance_batch_size}{at}: "
                  f"measured {report.balance:.3f}, predicted {result.plan.balance:.3f} from the node costs"
                  f"{' calibrated by served times' if report.calibration else ' profiled'} "
                  f"(best possible slowest stage {result.plan.optimum:.3f} ms, chosen "
                  f"{max(result.plan.stage_costs):.3f} ms, {_size(result.plan.bytes)} crossing the cuts)")
    if report.stages_chosen:
        console.print(report.stages_chosen)
    for index, step in enumerate(report.calibration):
        console.print(f"calibration round {index + 1}: cuts {step['cuts']}, slowest stage predicted "
                      f"{step['predicted_ms']:.3f} ms, measured {step['measured_ms']:.3f} ms "
                      f"(balance {step['measured_balance']:.3f})")
    if report.warning:
        console.print(f"[yellow]warning:[/yellow] {escape(report.warning)}")
    if report.unpadded:
        console.print(f"input diversity: {escape(report.unpadded)}")
    if report.coupled:
        console.print(f"[yellow]warning:[/yellow] batching changes answers: {escape(report.coupled)}")
    if result.changes:
        console.print("operator diversity, preferred batch size changes at: " + ", ".join(
            f"{name} ({change.before} -> {change.after})" for name, change in result.changes))
    else:
        console.print("operator diversity: every node prefers the same batch size")
    if result.policy:
        console.print("policy defaults in config.pbtxt: " + ", ".join(f"{k}={v}" for k, v in result.policy.items()))
    if result.policy.get("policy") == "auto":
        choice = choose(manifest, True, not on_gpu(manifest))
        console.print("how auto serves it (backend/decide/; the model's log says so when it loads): "
                      f"{'pipelined' if choice.pipeline else 'plain, inside execute'} ({choice.why})")
    console.print("time: " + ", ".join(f"{step} {sec:.1f} s" for step, sec in result.seconds.items()))
    console.print(f"stage tables measured on {Machine(**manifest.slicing.machine).describe()}: they hold "
                  "there (served elsewhere, python -m slicer.retime measures them again)")
    console.print(f"against the source model ({result.manifest.stages[0].precision}): max abs error "
                  f"{result.max_abs_error:.3g}, cosine similarity {result.cosine:.7f}")


def _stop(signum: int, _frame) -> None:
    """SIGTERM stops the slicer as Ctrl-C does, so that it cleans up what it started writing."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 150)
    began = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bars:
        tasks: dict[str, int] = {}

        def progress(what: str, done: int, total: int) -> None:
            if what not in tasks:
                tasks[what] = bars.add_task(what, total=total)
            bars.update(tasks[what], completed=done)
            if done == total and not console.is_terminal:  # logs get a line per finished step
                console.print(f"{what}: {total} of {total} done")

        signal.signal(signal.SIGTERM, _stop)
        try:
            result = slice_model(args.src, args.out, options_from(args), progress)
        except SliceError as exc:  # the user's model, options or folder: one line, as argparse does
            console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
            return 2
        except KeyboardInterrupt:
            console.print(f"stopped; {args.out} is as it was before")
            return 130
    summary(result, console)
    console.print(f"wrote {result.model_dir} in {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
