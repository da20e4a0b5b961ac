"""Variants of ``auto`` beside the forced pipeline under one Poisson load, in interleaved rounds:
each model's mean latency and its ratio to the first model's, round by round.

    python docs/results/perf-analyzer-sweeps/ab.py PROFILE.json RATE ROUNDS VARIANTS_JSON OUT
    (VARIANTS_JSON: model -> its parameters on top of auto's, e.g.
     '{"pipeline": {}, "auto": {}, "auto_nolone": {"lone_inline": "false"}}')
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from tools.lib.harness import Bench
from tools.lib.peers import Peer, write_variant, write_ways
from tools.lib.perf_analyzer import Load, PerfAnalyzerError
from tools.lib.workload import interface_of, synthetic, write_input_data


def main(profile: Path, rate: float, rounds: int, variants: dict[str, dict[str, str]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="ab-"))
    write_ways(profile, folder, {}, [], Peer())
    for name, parameters in variants.items():
        if name not in ("auto", "pipeline", "plain"):
            write_variant(folder / "auto", folder, name, parameters)
    data = write_input_data(synthetic(interface_of(folder / "auto"), 1, {}, lengths=[64]), folder / "data.json")
    models = list(variants)
    means: dict[str, list[float | None]] = {model: [] for model in models}
    with Bench(folder, log=out / "triton.log") as bench:
        for model in models:
            bench.load(model)
            bench.capacity(model, data, 16, 1.0)
        for turn in range(rounds):
            for model in models if turn % 2 == 0 else models[::-1]:
                try:
                    measured = bench.window(model, Load(rate=rate), data, 6, 5)
                except PerfAnalyzerError as exc:
                    print(model, "lost", exc)
                    means[model].append(None)
                    continue
                means[model].append(float(np.mean(measured.window.latency_ms)))
                print(turn, model, f"{means[model][-1]:.2f} ms", measured.served, measured.calls, flush=True)
    (out / "means.json").write_text(json.dumps(means) + "\n")
    for model in models[1:]:
        logs = np.log([a / b for a, b in zip(means[model], means[models[0]]) if a and b])
        half = 2.1 * logs.std(ddof=1) / np.sqrt(len(logs))
        print(f"{model} / {models[0]}: {np.exp(logs.mean()):.3f}x "
              f"[{np.exp(logs.mean() - half):.3f}, {np.exp(logs.mean() + half):.3f}]")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), Path(sys.argv[5]))
