"""How a closed loop's answers/s vary with the length of the window they are counted over: one
long perf_analyzer window per model, its answers counted per second and then over blocks of 1 to
24 s, each block's spread beside what independent seconds would give.

    python docs/results/perf-analyzer-sweeps/noise.py PROFILE.json MODELS CONCURRENCY SECONDS
"""

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from tools.lib.harness import Bench
from tools.lib.peers import Peer, write_ways
from tools.lib.perf_analyzer import Load, measure
from tools.lib.workload import interface_of, synthetic, write_input_data


def main(profile: Path, models: list[str], concurrency: int, seconds: float) -> None:
    folder = Path(tempfile.mkdtemp(prefix="noise-"))
    write_ways(profile, folder, {}, [], Peer())
    data = write_input_data(synthetic(interface_of(folder / "auto"), 1, {}, lengths=[64]), folder / "data.json")
    series = {}
    with Bench(folder, log=folder / "triton.log") as bench:
        for model in models:
            bench.load(model)
            bench.capacity(model, data, concurrency, 1.0)
        for model in models:
            window = measure(model, bench.url, Load(concurrency=concurrency), data, seconds, 3)
            answered = np.sort(window.sent_s + window.latency_ms / 1000)
            series[model] = np.histogram(answered, bins=np.arange(0, int(answered[-1]) + 1))[0][1:-1]
            print(model, "answers each second:", " ".join(str(n) for n in series[model]))
    for model, per_second in series.items():
        for block in (1, 3, 6, 12, 24):
            means = [per_second[i:i + block].mean() for i in range(0, len(per_second) - block + 1, block)]
            if len(means) > 2:
                independent = per_second.std(ddof=1) / per_second.mean() / np.sqrt(block)
                spread = np.std(means, ddof=1) / np.mean(means)
                print(f"{model} blocks of {block:2d} s: {len(means):3d} blocks, SD {spread:.1%}"
                      f" (independent seconds: {independent:.1%})")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]), float(sys.argv[4]))
