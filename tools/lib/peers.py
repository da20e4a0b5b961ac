"""The peers a Triton user deploys instead of dvabatch, written from a sliced model.

- **plain**: the unsliced source model as one plain model: ``plain_model.py`` (Python backend, one
  ONNX Runtime session, no dvabatch code) behind Triton's dynamic batcher, at delay 0 or tuned;
  text either batched by equal shapes only (Triton's default), padded by the model to the longest
  of a ragged batch (``allow_ragged_batch``), or padded by the client.
- **ensemble**: the sliced model's own stages, each its own plain model with its own dynamic
  batcher (``<name>_s0``, ``<name>_s1``, ...), wired by Triton's ensemble scheduler in C++. Every
  step batches again and a request leaves when its own last step ends: stage-level entry and exit
  without the paper's policies. The steps batch equal shapes only: an intermediate tensor padded
  with zeros is not what the padded model computes (an attention bias of 0 attends the padding).

On a GPU host each plain model or step can be Triton's ``onnxruntime`` (``model.onnx``) or
``tensorrt`` backend (``model.plan``, from a model sliced with ``--target tensorrt``) instead of the
Python one. A model sliced for torch gets Python peers on the same engine: ``plain_model.py`` runs
its ONNX file with the torch interpreter (``backend/engines/onnx_torch.py``, copied beside it) on the
device the model was sliced for, at its precision, and on a GPU as CUDA graphs over the same row
and length buckets as ours (``backend/engines/torch_graphs.py``, copied too; an ensemble's steps capture
each shape as it first comes, since only the first step's input shapes are known ahead). A
simulated model (timed stages, ``tools.simulate``) gets timed plain models: they sleep for their
table's time, the whole model's for the plain model and each stage's for a step.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from backend.engines import graph_buckets
from backend.manifest import LatencyTable, Manifest, StageSpec, TensorSpec
from slicer import triton_config
from slicer.triton_config import PARAMETER, parameters_of
from slicer.errors import SliceError
from slicer.slicing import VERSION, sha256
from slicer.targets import optimize
from tools.lib.paths import BACKEND_DIR, CACHE, SOURCES
from tools.lib.processes import CpuSplit
from tools.lib.timed import from_profile, timed_whole, write_timed

PLAIN_MODEL = Path(__file__).with_name("plain_model.py")
TORCH_FILES = (BACKEND_DIR / "engines" / "onnx_torch.py", BACKEND_DIR / "engines" / "torch_graphs.py")
BACKENDS = ("python", "onnxruntime", "tensorrt")


@dataclass(frozen=True)
class Peer:
    """How a plain model (or each step of an ensemble) is served."""

    delay_us: int = 0  # max_queue_delay_microseconds (of the first step, for an ensemble)
    spinning: bool = True  # ONNX Runtime's default; False: idle threads sleep
    ragged: bool = False  # plain only: requests of different lengths share a batch, padded
    backend: str = "python"
    # intra_op_thread_count; 0: ONNX Runtime's default (the machine's cores), or where the host is split
    # (``$DVABATCH_CLIENT_CPUS``) the server's CPUs, the machine the split stands for (``server_threads``)
    threads: int = 0
    # > 0: Triton's queue policy refuses a request still queued after its own timeout (the client's,
    # where shorter) or this many microseconds (REJECT, allow_timeout_override: Triton reads a
    # request's timeout only below a default it has).
    timeout_us: int = 0
    # Triton's preferred batch sizes: with a long ``delay_us``, a batch leaves once that many
    # requests wait. No static size: Triton grows a batch that waits for the instance past it.
    preferred: tuple[int, ...] = ()
    # instance_group's count: copies of the model, each a stub of its own, that Triton hands calls to
    # in turn (``write_ways`` gives ours as many: a user adds instances to each way alike).
    instances: int = 1


def find_source(manifest: Manifest, given: Path | None, among: Sequence[Path] = ()) -> Path:
    """The unsliced source of ``manifest``, checked by its sha256: ``given``, or else the first
    of ``among`` (sources given for several models), the file it was sliced from and the slicer's
    cache that is it."""
    candidates = [given] if given else [*among, Path(manifest.source_file), SOURCES / Path(manifest.source_file).name]
    for path in candidates:
        if path is not None and path.is_file() and sha256(path) == manifest.source_sha256:
            return path
    if given:
        raise SliceError(f"{given} is not the model this one was sliced from (sha256 differs, or it is missing)")
    raise SliceError(f"the source model {manifest.source_file!r} was not found; pass it with --source")


def link(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` where the file system allows (model files can be
    large), else a copy."""
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def link_version(model_dir: Path, out: Path) -> None:
    """``out`` afresh with the version folder of ``model_dir``, its files linked."""
    shutil.rmtree(out, ignore_errors=True)
    (out / VERSION).mkdir(parents=True)
    for item in (model_dir / VERSION).iterdir():
        link(item, out / VERSION / item.name)


def timed(manifest: Manifest) -> bool:
    return all(s.engine == "timed" for s in manifest.stages)


def whole_table(manifest: Manifest) -> LatencyTable | None:
    """The unsliced model's latency: a simulated model's own whole table, else the stages' sum."""
    if timed(manifest):
        return Manifest.load(timed_whole(manifest) / VERSION).stages[0].latency
    return manifest.fused().stages[0].latency


def delay_candidates(manifest: Manifest) -> list[int]:
    """Batcher delays worth trying (us): half and all of one query's time and of a full batch's
    time on the whole model at its longest length."""
    table = whole_table(manifest)
    if table is None:
        return [1000, 4000]
    row = table.row(table.lengths[-1] if table.lengths else None)
    return sorted({max(100, round(ms * 1000 / 100) * 100) for ms in (row[0] / 2, row[0], row[-1] / 2, row[-1])})


def dense_table(table: LatencyTable, max_batch_size: int, length_index: int | None) -> dict:
    """``latency_ms.json`` of a timed plain model: the table's prediction for every row count up
    to ``max_batch_size`` and every length up to the longest tabulated one."""
    if table.axis is None or length_index is None:
        return {"axis": None, "ms": [round(table.predict(rows), 4) for rows in range(1, max_batch_size + 1)]}
    return {"axis": length_index, "ms": [[round(table.predict(rows, length), 4) if length else 0.0
                                          for length in range(table.lengths[-1] + 1)]
                                         for rows in range(1, max_batch_size + 1)]}


def on_torch(manifest: Manifest) -> bool:
    """The model was sliced for torch: its peers run torch too, where it was profiled."""
    return all(s.engine == "torch" for s in manifest.stages)


def on_gpu(manifest: Manifest, peer: Peer) -> bool:
    return peer.backend != "python" or (on_torch(manifest) and manifest.slicing is not None
                                        and manifest.slicing.device == "cuda")


def _engine_files(peer: Peer, source: Path, version: Path, manifest: Manifest) -> None:
    """The engine file of a plain model or step (and the plain model itself for the Python backend,
    with the torch interpreter for a model sliced for torch)."""
    name = "model.plan" if peer.backend == "tensorrt" else "model.onnx"
    link(source, version / name)
    if peer.backend == "python":
        shutil.copy(PLAIN_MODEL, version / "model.py")
        if on_torch(manifest):
            for path in TORCH_FILES:
                shutil.copy(path, version / path.name)
    if source.suffix == ".onnx":  # weights kept beside an ONNX file go along
        import onnx

        model = onnx.load(str(source), load_external_data=False)
        for location in {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}:
            link(source.parent / location, version / location)


def _timed_files(table: LatencyTable, spec_inputs: tuple[TensorSpec, ...], max_batch_size: int,
                 version: Path) -> None:
    index = next((s.dims.index(table.axis) for s in spec_inputs[:1] if table.axis in s.dims), None)
    (version / "latency_ms.json").write_text(json.dumps(dense_table(table, max_batch_size, index)))
    shutil.copy(PLAIN_MODEL, version / "model.py")


def _parameters(peer: Peer, manifest: Manifest, length_inputs: dict[str, int] | None = None,
                length_outputs: dict[str, int] | None = None, whole: bool = False) -> dict[str, str]:
    """plain_model.py's parameters: the torch engine as ours runs it (its precision; on a GPU its
    CUDA graphs' row buckets, and for the whole model their length buckets), ONNX Runtime's
    threads, and the tensors with a length axis (padded together where ``peer.ragged``)."""
    parameters: dict[str, str] = {}
    if peer.backend == "python" and on_torch(manifest):
        parameters.update(engine="torch", precision=manifest.stages[0].precision)
        if on_gpu(manifest, peer):
            rows, lengths = graph_buckets(manifest)
            parameters["graph_rows"] = ",".join(map(str, rows))
            if whole and lengths and length_inputs:
                parameters["length_buckets"] = ",".join(map(str, lengths))
    threads = peer.threads or server_threads()
    if threads:
        parameters["intra_op_thread_count"] = str(threads)
    if not peer.spinning:
        parameters["allow_spinning"] = "false"
    if length_inputs and (peer.ragged or "length_buckets" in parameters):
        parameters["length_inputs"] = ",".join(f"{n}:{a}" for n, a in length_inputs.items())
        parameters["length_outputs"] = ",".join(f"{n}:{a}" for n, a in (length_outputs or {}).items())
    if peer.ragged:
        parameters["ragged"] = "true"
    return parameters


def server_threads() -> int:
    """The server's CPUs where ``$DVABATCH_CLIENT_CPUS`` splits the host (0 where it does not):
    the threads a peer's ONNX Runtime session takes there. The split stands for a server
    machine with those CPUs, where ONNX Runtime's default takes them all; on the split host its
    default still counts every core of the machine, and on the CPU left to tritonserver of the
    project's two, the plain BERT-like model answered 584-701/s at one request in flight against
    947-985 with one thread (docs/results/check-auto-real-pinned). Ours reads the CPUs its process
    may use (``backend/host.py``)."""
    split = CpuSplit.from_env()
    return len(split.server) if split else 0


def _check(peer: Peer, manifest: Manifest) -> None:
    if peer.backend not in BACKENDS:
        raise ValueError(f"backend {peer.backend!r} is not one of {', '.join(BACKENDS)}")
    if timed(manifest) and peer.backend != "python":
        raise ValueError("a simulated model's peers are timed plain models: backend python")
    if peer.backend == "tensorrt" and any(s.engine != "tensorrt" for s in manifest.stages):
        raise ValueError("the tensorrt backend needs a model sliced with --target tensorrt")
    if any(not 0 < size <= manifest.max_batch_size for size in peer.preferred):
        raise ValueError(f"preferred batch sizes {list(peer.preferred)} must lie in 1..{manifest.max_batch_size}")
    if peer.ragged and peer.backend != "python":
        raise ValueError("ragged batches are padded by the Python plain model: backend python")


def folded(source: Path, manifest: Manifest) -> Path:
    """``source`` as the slicer folded it before cutting (ONNX Runtime's optimiser at the level
    the manifest records), cached: what a torch model's plain peer runs rather than the raw
    export, since the torch interpreter pays per node and a raw export's shape arithmetic doubles
    BERT-base's (on an H200: 33 ms a query against 9.4 ms for the stages cut from the folded graph)."""
    level = manifest.slicing.optimization
    out = CACHE / "whole" / f"{Path(manifest.source_file).stem}-{manifest.source_sha256[:16]}-{level}.onnx"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(f".{os.getpid()}.partial")
        optimize(source, partial, level)
        os.replace(partial, out)
    return out


def write_plain(model_dir: Path, repository: Path, name: str, peer: Peer = Peer(), source: Path | None = None,
                among: Sequence[Path] = ()) -> Path:
    """``repository/name``: the unsliced model of the sliced ``model_dir`` as one plain model
    (its source: see ``find_source``)."""
    manifest = Manifest.load(model_dir / VERSION)
    _check(peer, manifest)
    if peer.backend == "tensorrt":
        raise ValueError("a plain TensorRT model is the whole model as one engine: python -m slicer SRC --stages 1 "
                         "--target tensorrt")
    out = repository / name
    shutil.rmtree(out, ignore_errors=True)
    (out / VERSION).mkdir(parents=True)
    if timed(manifest):
        whole = Manifest.load(timed_whole(manifest) / VERSION)
        inputs, outputs = whole.inputs, whole.outputs
        _timed_files(whole.stages[0].latency, inputs, manifest.max_batch_size, out / VERSION)
    else:
        inputs, outputs = manifest.inputs, manifest.outputs
        whole = find_source(manifest, source, among)
        if peer.backend == "python" and on_torch(manifest) and manifest.slicing is not None:
            whole = folded(whole, manifest)
        _engine_files(peer, whole, out / VERSION, manifest)
    axis = manifest.length_axis
    length_inputs = {s.name: s.dims.index(axis) for s in inputs if axis in s.dims} if axis else {}
    length_outputs = {s.name: s.dims.index(axis) for s in outputs if axis in s.dims} if axis else {}
    if peer.ragged and not length_inputs:
        raise ValueError(f"{model_dir.name} has no length axis to pad along")
    note = ("# Peer: the unsliced model as one plain model behind Triton's dynamic batcher"
            + (f"; requests of different '{axis}' padded to the longest" if peer.ragged else "") + ".\n")
    (out / "config.pbtxt").write_text(_config(name, peer, manifest.max_batch_size, inputs, outputs,
                                              _parameters(peer, manifest, length_inputs, length_outputs, whole=True),
                                              note, on_gpu(manifest, peer),
                                              ragged=set(length_inputs) if peer.ragged else set()))
    return out


def _tensors(specs, ragged: set[str] = frozenset()) -> str:
    return ",\n".join(triton_config.tensor_line(s, s.name in ragged) for s in specs)


def _config(name: str, peer: Peer, max_batch_size: int, inputs, outputs, parameters: dict[str, str], note: str,
            gpu: bool, ragged: set[str] = frozenset()) -> str:
    engine = {"python": 'backend: "python"', "onnxruntime": 'platform: "onnxruntime_onnx"',
              "tensorrt": 'platform: "tensorrt_plan"'}[peer.backend]
    kind = "KIND_GPU" if gpu else "KIND_CPU"
    return (
        f'name: "{name}"\n{engine}\nmax_batch_size: {max_batch_size}\n'
        f"input [\n{_tensors(inputs, ragged)}\n]\noutput [\n{_tensors(outputs)}\n]\n"
        f"dynamic_batching {{ max_queue_delay_microseconds: {peer.delay_us}{_preferred(peer)}{_queue_policy(peer)} }}\n"
        f"instance_group [ {{ kind: {kind} count: {peer.instances} }} ]\n" + note
        + "".join(f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in parameters.items())
    )


def _preferred(peer: Peer) -> str:
    return f" preferred_batch_size: [ {', '.join(map(str, peer.preferred))} ]" if peer.preferred else ""


def _queue_policy(peer: Peer) -> str:
    if peer.timeout_us <= 0:
        return ""
    return (f" default_queue_policy {{ timeout_action: REJECT default_timeout_microseconds: {peer.timeout_us}"
            " allow_timeout_override: true }")


def ensemble_tensors(manifest: Manifest) -> list[tuple[dict[str, str], dict[str, str]]]:
    """Per stage, (input -> ensemble tensor, output -> ensemble tensor). A stage output keeps its
    name where it is a model output no later stage writes again, else it is named after its
    stage (timed stages write the same names at every stage; an ensemble tensor has one producer)."""
    model_outputs = {s.name for s in manifest.outputs}
    producer: dict[str, str] = {s.name: s.name for s in manifest.inputs}
    maps = []
    for k, stage in enumerate(manifest.stages):
        inputs = {s.name: producer[s.name] for s in stage.inputs}
        outputs = {}
        for spec in stage.outputs:
            last = not any(spec.name in {o.name for o in later.outputs} for later in manifest.stages[k + 1:])
            outputs[spec.name] = spec.name if spec.name in model_outputs and last else f"{spec.name}__s{k}"
            producer[spec.name] = outputs[spec.name]
        maps.append((inputs, outputs))
    return maps


def write_ensemble(model_dir: Path, repository: Path, name: str, peer: Peer = Peer()) -> list[Path]:
    """``repository/name`` (the ensemble) and ``repository/name_s<k>`` (one plain model per stage
    of the sliced ``model_dir``); returns the steps, then the ensemble."""
    manifest = Manifest.load(model_dir / VERSION)
    _check(peer, manifest)
    if peer.ragged:
        raise ValueError("an ensemble's steps batch equal shapes only (see tools.baselines)")
    written = [_step(model_dir, repository, f"{name}_s{stage.index}", stage, manifest, peer)
               for stage in manifest.stages]
    steps = ",\n".join(
        f'    {{ model_name: "{name}_s{k}" model_version: -1\n'
        + "".join(f'      input_map {{ key: "{key}" value: "{value}" }}\n' for key, value in inputs.items())
        + "".join(f'      output_map {{ key: "{key}" value: "{value}" }}\n' for key, value in outputs.items())
        + "    }" for k, (inputs, outputs) in enumerate(ensemble_tensors(manifest)))
    out = repository / name
    shutil.rmtree(out, ignore_errors=True)
    (out / VERSION).mkdir(parents=True)
    (out / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {manifest.max_batch_size}\n'
        f"# Peer: the {len(manifest.stages)} stages of {model_dir.name}, each its own model with its own dynamic "
        "batcher, wired by Triton's ensemble scheduler.\n"
        f"input [\n{_tensors(manifest.inputs)}\n]\noutput [\n{_tensors(manifest.outputs)}\n]\n"
        f"ensemble_scheduling {{\n  step [\n{steps}\n  ]\n}}\n")
    return [*written, out]


def _step(model_dir: Path, repository: Path, name: str, stage: StageSpec, manifest: Manifest, peer: Peer) -> Path:
    """One stage as a plain model; later steps take their batches without waiting (delay 0, no
    preferred size)."""
    out = repository / name
    shutil.rmtree(out, ignore_errors=True)
    (out / VERSION).mkdir(parents=True)
    if stage.engine == "timed":
        _timed_files(stage.latency, stage.inputs, manifest.max_batch_size, out / VERSION)
    else:
        _engine_files(peer, model_dir / VERSION / stage.file, out / VERSION, manifest)
    if stage.index:
        peer = replace(peer, delay_us=0, preferred=())
    (out / "config.pbtxt").write_text(_config(name, peer, manifest.max_batch_size, stage.inputs, stage.outputs,
                                              _parameters(peer, manifest),
                                              f"# Step {stage.index} of the ensemble of {model_dir.name}.\n",
                                              on_gpu(manifest, peer)))
    return out


def write_variant(model_dir: Path, repository: Path, name: str, overrides: Mapping[str, str]) -> Path:
    """``model_dir`` as model ``name`` with ``overrides`` on its config.pbtxt parameters; the rest
    of its config (instances, batcher, comments) as the user left it."""
    out = repository / name
    link_version(model_dir, out)
    lines = (model_dir / "config.pbtxt").read_text().splitlines()
    parameters = parameters_of("\n".join(lines))
    if "policy" in overrides:
        parameters = {k: v for k, v in parameters.items() if not k.startswith("policy.")}
    parameters.update(overrides)
    kept = [re.sub(r'^name:\s*".*"', f'name: "{name}"', line) for line in lines if not PARAMETER.match(line.strip())]
    kept += [f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in parameters.items()]
    (out / "config.pbtxt").write_text("\n".join(kept) + "\n")
    return out


def set_instances(config: Path, count: int) -> None:
    """``config`` (a config.pbtxt) with ``count`` instances in each of its instance groups."""
    text, groups = re.subn(r"(instance_group\s*\[[^\]]*?count:\s*)\d+", lambda m: f"{m.group(1)}{count}",
                           config.read_text())
    if not groups:
        raise ValueError(f"{config}: no instance_group count to set")
    config.write_text(text)


def write_ways(profile: Path, folder: Path, parameters: Mapping[str, str] = {},
               sources: Sequence[Path] = (), peer: Peer = Peer()) -> dict[str, list[str]]:
    """Four ways of serving one engine in ``folder``, from a timed profile or a sliced model
    directory (real stages, on the device it was sliced for; its unsliced source among
    ``sources`` or where the slicer found it): ``auto`` (ours as the slicer configured it),
    ``pipeline`` (ours, ``policy: pass``), ``plain`` and ``ensemble``; ``parameters`` go on top
    of ours, ``peer`` says how the last two are served (but an ensemble's steps batch equal
    shapes only, ragged or not), and its instances are every way's. Returns model -> the Triton
    models whose batches count."""
    if profile.is_dir():
        write_variant(profile, folder, "auto", parameters)
        write_variant(profile, folder, "pipeline", {**parameters, "policy": "pass"})
    else:
        _, manifest, written_parameters = from_profile(profile)
        ours = {**written_parameters, **parameters}
        tables = [s.latency for s in manifest.stages]
        identity = (manifest.source_file, manifest.source_sha256)
        for model, policy in (("auto", ours), ("pipeline", {**ours, "policy": "pass"})):
            written = write_timed(model, manifest.inputs, tables, manifest.max_batch_size, *identity, folder / model,
                                  policy, manifest.whole)
        timed_whole(written)
    if peer.instances != 1:  # (else ours keep the count their config has)
        for model in ("auto", "pipeline"):
            set_instances(folder / model / "config.pbtxt", peer.instances)
    write_plain(folder / "auto", folder, "plain", peer, among=sources)
    steps = [p.name for p in write_ensemble(folder / "auto", folder, "ensemble", replace(peer, ragged=False))[:-1]]
    return {"plain": ["plain"], "ensemble": steps, "pipeline": ["pipeline"], "auto": ["auto"]}
