"""Forced pipelines under several policies beside ``pipeline`` (``policy: pass``) and ``auto``, at one
load, in one tritonserver, each round in turn (every other round reversed).

    PYTHONPATH=. python docs/results/stretch-queued/variants.py PROFILE LOAD ROUNDS "load,load;t_comp_wait_ms=0"

LOAD is a Poisson rate in requests/s (``840``) or a closed loop's requests in flight (``c64``).

Each variant is ``POLICY[;SETTING=VALUE...]``: a copy of ``pipeline`` with ``policy`` and its
``policy.SETTING`` parameters. Prints each model's mean latency per round (answers/s for a
closed loop), their mean, and the geometric mean of its ratio to ``pipeline`` round by round.
"""

import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from tools.lib.harness import Bench
from tools.lib.peers import write_ways
from tools.lib.perf_analyzer import Load, measure
from tools.lib.workload import interface_of, synthetic, write_input_data


def variant(repository: Path, spec: str) -> str:
    policy, *settings = spec.split(";")
    name = "p_" + "".join(c if c.isalnum() else "_" for c in spec)
    shutil.copytree(repository / "pipeline", repository / name, symlinks=True)
    config = repository / name / "config.pbtxt"
    old = 'parameters: { key: "policy" value: { string_value: "pass" } }'
    lines = [f'parameters: {{ key: "policy" value: {{ string_value: "{policy}" }} }}']
    lines += [f'parameters: {{ key: "policy.{k}" value: {{ string_value: "{v}" }} }}'
              for k, v in (setting.split("=") for setting in settings)]
    text = config.read_text()
    assert old in text
    config.write_text(text.replace(old, "\n".join(lines)).replace('name: "pipeline"', f'name: "{name}"'))
    return name


def main() -> None:
    profile, rounds, specs = Path(sys.argv[1]), int(sys.argv[3]), sys.argv[4].split(",")
    spec = sys.argv[2]
    load = Load(concurrency=int(spec[1:])) if spec.startswith("c") else Load(rate=float(spec))
    folder = Path(tempfile.mkdtemp(prefix="variants-"))
    repository = folder / "repository"
    write_ways(profile, repository)
    for step in repository.glob("ensemble*"):
        shutil.rmtree(step)
    models = ["pipeline", "auto", *(variant(repository, spec) for spec in specs)]
    data = write_input_data(synthetic(interface_of(repository / "auto"), 1, {}, lengths=(64,)), folder / "data.json")
    means: dict[str, list[float]] = {model: [] for model in models}
    with Bench(repository, log=folder / "tritonserver.log") as bench:
        for model in models:
            bench.load(model)
        for round_ in range(rounds):
            for model in models if round_ % 2 == 0 else models[::-1]:
                window = measure(model, bench.url, load, data, 6, 5)
                means[model].append(window.throughput if load.closed else window.mean_ms)
    for model, got in means.items():
        ratio = statistics.geometric_mean([a / b for a, b in zip(got, means["pipeline"])])
        print(model, " ".join(f"{x:.2f}" for x in got), f"mean {statistics.fmean(got):.2f}", f"vs pipeline {ratio:.3f}")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
