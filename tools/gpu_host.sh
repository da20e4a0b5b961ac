#!/usr/bin/env bash
# DVABatch on a GPU host without network, from the bundle `python -m tools.gpu_bundle` writes.
#
#   dvabatch-gpu/host.sh [--dry-run] [--work DIR] [--out DIR] [--project DIR] STEP...
#
# Steps, in the order `all` runs them (`engine` and `cost` are left out of `all`: `measure` covers more):
#   check    the host's Python matches the bundled stub; torch sees a GPU; the modules the project
#            needs import; tritonserver, the backend and the stub find every library; perf_analyzer runs
#   setup    WORK/venv: a virtualenv of the host's Python holding the bundled numpy<2, tritonclient,
#            protobuf and python-rapidjson, then the host's own packages (torch...); every step that
#            serves runs its python3, and so do the backend stubs (below)
#   models   BERT-base and ResNet-50 with random weights, exported here and sliced for torch on the GPU
#            in FP16, up to 64 rows (CUDA graphs per shape bucket, captured when a model loads)
#   test     the GPU tests (CUDA streams and events, graphs, the torch engine, schedules) and the
#            real-Triton tests, with the bundled tritonserver
#   gpu_test (not in `all`) the GPU tests alone (tests/test_cuda.py, tests/test_torch.py): half a minute
#   measure  tools.compare of each model against the plain model and the ensemble on the same engine
#            (perf_analyzer; GLUE RTE and SST-2 for BERT-base), outputs under --out
#   engine   tools.engine_bench of each model: every stage's time per bucket beside torch's own model
#            (transformers' BertModel, torchvision's ResNet-50; FP16, CUDA graph), outputs under --out
#   cost     tools.bench_cost of each model (closed loops at 1, 16 and 64 in flight: the plain model,
#            the ensemble, the forced pipeline and auto, with CPU per request), then near-zero compute
#            at 1 in flight with every execute call traced (tools.trace: the time inside execute,
#            ours beside the plain model's, against the time between calls), outputs under --out
#   auto     (not in `all`) tools.check_auto on the host's CPU: auto against the better of the plain
#            model and the forced pipeline on the three timed profiles (about 5 minutes), under --out
#   dispatch (not in `all`) tools.bench_dispatch on the host's CPU: `policy: smdp` (pipelined, and with
#            policy.auto) against Triton's batcher at its best delay, at 0.5 and 0.9 of the peak, on the
#            TensorRT-speed profile (issue 40's live target, missed on a 2-core host), under --out
#   send     (not in `all`) tools.send_cost: what an answer sent through its response sender costs
#            beside one returned from execute on this host, the ceiling of any multi-exit answer
#            (about 2 minutes), under --out
#   gpu      (not in `all`) what one short lease does, in under 8 minutes: check setup models, the GPU
#            tests, cost (one round of 2 s windows), engine, then one archive of --out (OUT.tar.gz,
#            beside OUT: a lent machine returns a handful of files, so copy that one back)
#   env      (not in `all`) print the environment as export lines, for commands of your own:
#            eval "$(dvabatch-gpu/host.sh env)"; cd dvabatch-gpu/project && python3 -m tools.bench_cost ...
# --project: the repository to run (default: the bundle's project/; a bundle built with --no-project
# has none, and a checkout of the same commit is given instead).
# --dry-run runs the checks that need no GPU and prints every other command instead of running it.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PYTHON:-python3}"
WORK="$HERE/work"
OUT="$HERE/results"
PROJECT="$HERE/project"
DRY=0
STEPS=()
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; }  # the comment above, however long it grows
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --work) WORK="$2"; shift ;;
        --out) OUT="$2"; shift ;;
        --project) PROJECT="$(cd "$2" && pwd)"; shift ;;
        all) STEPS+=(check setup models test measure) ;;
        gpu) STEPS+=(check setup models gpu_test cost engine archive)
             COST_ROUNDS="${COST_ROUNDS:-1}" COST_SECONDS="${COST_SECONDS:-2}" ;;
        check|setup|models|gpu_test|test|measure|engine|cost|auto|dispatch|send|env) STEPS+=("$1") ;;
        -h|--help) usage; exit 0 ;;
        *) echo "host.sh: unknown step or option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ ${#STEPS[@]} -gt 0 ] || { usage; exit 2; }
[ -d "$PROJECT/backend" ] || { echo "host.sh: no project at $PROJECT (this bundle has none: give --project DIR)" >&2; exit 2; }

WANT_PYTHON="$(sed -n 's/^python //p' "$HERE/BUNDLE.txt")"
# The backend stubs ignore PYTHONPATH (their Python runs with -E) and take their packages from the
# first python3 on tritonserver's PATH, virtualenv included: on a host whose Python has numpy 2
# they passed every tensor empty (Triton 24.10's stubs were built for numpy 1; seen on an H200).
# So the steps that serve run the python3 of WORK/venv, which tools.lib.triton puts first on
# tritonserver's PATH: the bundled numpy<2 first, then the host's site-packages (a .pth file).
VENV="$WORK/venv"
SERVE="$VENV/bin/python3"
VENV_SITE="$VENV/lib/python$WANT_PYTHON/site-packages"
HOST_SITE="$("$PY" -c 'import site; print(":".join(site.getsitepackages()))')"
export PYTHONPATH="$PROJECT${PYTHONPATH:+:$PYTHONPATH}"
# libpython's folder (where a Python not installed by the system keeps it) on the loader's path
LIBPYTHON_DIR="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')"
if [ ! -e "$LIBPYTHON_DIR/libpython$WANT_PYTHON.so.1.0" ]; then  # not where sysconfig says: the first found
    found="$(find /usr /opt /root -name "libpython$WANT_PYTHON.so.1.0" 2>/dev/null | head -1 || true)"
    [ -z "$found" ] || LIBPYTHON_DIR="$(dirname "$found")"
fi
export LD_LIBRARY_PATH="$LIBPYTHON_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DVABATCH_PERF_ANALYZER="$HERE/perf_analyzer/bin/perf_analyzer"
export DVABATCH_TRITON_HOME="$HERE/triton"
export DVABATCH_GLUE="$HERE/glue"
export DVABATCH_CACHE="$WORK/cache"
REPOSITORY="$WORK/repository"

run() {  # a command, or in a dry run its words
    echo "+ $*"
    if [ "$DRY" = 0 ]; then "$@"; fi
}

fail() { echo "host.sh: $*" >&2; exit 2; }

check() {
    local have
    have="$("$PY" -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')"
    [ "$have" = "$WANT_PYTHON" ] || fail "the bundle carries the stub for Python $WANT_PYTHON; $PY is $have (build it with: python -m tools.gpu_bundle --python $have)"
    echo "python $have: matches the bundled stub"
    local missing
    missing="$("$PY" - <<'EOF'
import importlib
names = ["torch", "onnx", "onnxruntime", "grpc", "google.protobuf", "rich", "tokenizers", "matplotlib", "pytest",
         "pytest_timeout", "urllib3", "ml_dtypes"]
print(" ".join(n for n in names if importlib.util.find_spec(n.split(".")[0]) is None))
EOF
)"
    [ -z "$missing" ] || fail "the host's Python lacks: $missing (the bundle carries only numpy<2, tritonclient, protobuf, python-rapidjson)"
    echo "modules: all there"
    for module in transformers torchvision; do  # the models step exports BERT-base and ResNet-50 with them
        "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$module') is None)" \
            || echo "warning: no $module here: the models step cannot export what needs it"
    done
    local unresolved
    unresolved="$(LD_LIBRARY_PATH="$HERE/triton/lib:$LD_LIBRARY_PATH" ldd \
        "$HERE/triton/bin/tritonserver" "$HERE/triton/backends/python/libtriton_python.so" \
        "$HERE/triton/python_backend_stubs/$WANT_PYTHON/triton_python_backend_stub" | grep 'not found' | sort -u || true)"
    [ -z "$unresolved" ] || fail "libraries not found: $unresolved"
    echo "tritonserver, the Python backend and its stub: every library found"
    "$HERE/perf_analyzer/bin/perf_analyzer" --version 2>&1 | grep -q 'Version 2.51.0' \
        || fail "perf_analyzer does not run: $("$HERE/perf_analyzer/bin/perf_analyzer" --version 2>&1 | tail -1)"
    echo "perf_analyzer 2.51.0 runs"
    if [ "$DRY" = 1 ]; then
        echo "+ $PY -c 'import torch; assert torch.cuda.is_available()'"
    else
        "$PY" -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"; print("GPU:", torch.cuda.get_device_name(0), "torch", torch.__version__)'
    fi
}

setup() {
    run "$PY" -m venv --without-pip --clear "$VENV"
    run "$PY" -m pip install --quiet --no-index --no-deps --no-cache-dir --upgrade --target "$VENV_SITE" "$HERE"/wheels/*.whl
    local dir lines=""
    for dir in ${HOST_SITE//:/ }; do  # addsitedir: the host's own .pth files count too
        lines+="import site; site.addsitedir('$dir')"$'\n'
    done
    echo "+ $VENV_SITE/host.pth: the host's site-packages after the bundled packages"
    if [ "$DRY" = 0 ]; then printf '%s' "$lines" > "$VENV_SITE/host.pth"; fi
    run "$SERVE" -c 'import numpy, tritonclient.grpc, torch, backend.engines.onnx_torch, tools.lib.perf_analyzer as pa; assert numpy.__version__ < "2", numpy.__version__; print("numpy", numpy.__version__, "torch", torch.__version__, "perf_analyzer", pa.binary())'
}

models() {
    # The export and the slicer run the host's own Python: its transformers may not import beside
    # the bundled numpy<2 (seen on an H200 host), which only what serves needs.
    run "$PY" -m tools.models bert_base resnet50_tv --target torch --device cuda \
        --precision fp16 --max-batch-size 64 --repository "$REPOSITORY"
    if [ -f "$HERE/tokenizer.json" ]; then
        run cp "$HERE/tokenizer.json" "$DVABATCH_CACHE/sources/bert_base.tokenizer.json"
    fi
}

gpu_pytest() {  # the project's tests named, on the GPU, with the Python the stubs run
    run sh -c "cd \"$PROJECT\" && DVABATCH_TEST_DEVICE=GPU \"$SERVE\" -m pytest -q -p no:cacheprovider $*"
}

gpu_test() {
    gpu_pytest tests/test_cuda.py tests/test_torch.py
}

engine() {
    # in-process (no stub), on the host's own Python and packages (see models)
    run "$PY" -m tools.engine_bench "$REPOSITORY/bert_base" --reference bert_base \
        --out "$OUT/engine-bert_base"
    run "$PY" -m tools.engine_bench "$REPOSITORY/resnet50_tv" --reference resnet50 \
        --out "$OUT/engine-resnet50"
}

archive() {
    run tar czf "$OUT.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
}

test_step() {
    gpu_pytest tests/test_cuda.py tests/test_torch.py tests/test_schedule.py tests/test_runtime.py tests/test_units.py \
        tests/test_e2e.py
}

measure() {
    local tokenizer="$DVABATCH_CACHE/sources/bert_base.tokenizer.json"
    [ "$DRY" = 1 ] || [ -f "$tokenizer" ] || tokenizer="$HERE/tokenizer.json"
    for task in RTE SST-2; do
        run "$SERVE" -m tools.compare "$REPOSITORY/bert_base" --dataset "glue:$task" --tokenizer "$tokenizer" \
            --rounds 1 --window 5 --out "$OUT/bert-base-$task"
    done
    run "$SERVE" -m tools.compare "$REPOSITORY/resnet50_tv" --rounds 1 --window 5 --out "$OUT/resnet50"
}

cost() {
    for model in bert_base resnet50_tv; do
        run "$SERVE" -m tools.bench_cost "$REPOSITORY/$model" --concurrency 1,16,64 --rounds "${COST_ROUNDS:-2}" \
            --seconds "${COST_SECONDS:-3}" --out "$OUT/cost-$model" || failed=1  # (a failed peer: the rest measured)
    done
    run mkdir -p "$OUT/trace-zero"
    run env DVABATCH_TRACE="$OUT/trace-zero/t" "$SERVE" -m tools.bench_cost "$PROJECT/docs/profiles/zero_2stages.json" \
        --models plain,auto --concurrency 1 --rounds "${COST_ROUNDS:-2}" --seconds "${COST_SECONDS:-3}" \
        --out "$OUT/cost-zero" || failed=1
    for trace in "$OUT"/trace-zero/t-*.tsv; do
        if [ -e "$trace" ]; then run "$SERVE" -m tools.trace "$trace" --show 0 --skip 1; fi
    done
    return "${failed:-0}"
}

auto() {  # no model of its own: timed profiles, the host's CPU and the stub's interpreter
    run sh -c "cd \"$PROJECT\" && \"$SERVE\" -m tools.check_auto --concurrency 1,16,64 --loads 0.3,0.6,0.9 \
        --seconds ${AUTO_SECONDS:-2} --warmup 1 --out \"$OUT/check-auto\"" || true  # (a cell outside: exit 1)
}

dispatch() {  # no model of its own: a timed profile, the host's CPU and the stub's interpreter
    run sh -c "cd \"$PROJECT\" && \"$SERVE\" -m tools.bench_dispatch docs/profiles/bert_base_trt_a100_2stages.json \
        --loads 0.5,0.9 --policies '' --static 64 --rounds ${DISPATCH_ROUNDS:-2} --seconds ${DISPATCH_SECONDS:-3} \
        --warmup 1 --out \"$OUT/dispatch\""
}

send() {  # no model: identity Python models, the host's CPU and tritonserver
    run sh -c "cd \"$PROJECT\" && \"$SERVE\" -m tools.send_cost --rounds 2 --out \"$OUT/send-cost\""
}

env_step() {
    local name
    printf 'export PATH=%q\n' "$VENV/bin:$PATH"  # python3: the one the stubs run (see setup)
    for name in PYTHONPATH LD_LIBRARY_PATH DVABATCH_PERF_ANALYZER DVABATCH_TRITON_HOME DVABATCH_GLUE DVABATCH_CACHE; do
        printf 'export %s=%q\n' "$name" "${!name}"
    done
}

for step in "${STEPS[@]}"; do
    [ "$step" = env ] || echo "== $step"
    case "$step" in
        test) test_step ;;
        env) env_step ;;
        *) "$step" ;;
    esac
done
