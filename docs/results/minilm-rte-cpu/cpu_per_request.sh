#!/bin/bash
# CPU time per answered request, ours (policy auto: fused, spinning within runs) against
# ZeroBatch (Triton's batcher, equal shapes, spinning), closed loop at concurrency 1 and 4, GLUE
# RTE unpadded. CPU time is read from /proc for each model's Python stub (where ONNX Runtime
# computes) and for tritonserver; requests from Triton's own success counter.
# Needs `make models`. Run from anywhere: bash docs/results/minilm-rte-cpu/cpu_per_request.sh
set -e
cd "$(dirname "$0")/../../.."
work=$(mktemp -d /tmp/dvabatch-cpu-XXXX)
cp -r model_repository_real/minilm "$work/minilm"
.venv/bin/python -m tools.baselines model_repository_real/minilm --exact-shapes --allow-spinning \
    --repository "$work" > /dev/null
.venv/bin/python -m tools.serve --model-repository "$work" --grpc-port 18001 --http-port 18000 \
    --metrics-port 18002 > "$work/serve.log" 2>&1 &
serve=$!
trap 'kill $serve 2>/dev/null; wait $serve 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 120); do curl -sf localhost:18000/v2/health/ready && break; sleep 1; done
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # user + system, in 1/100 s
answered() { curl -s localhost:18002/metrics | awk -v m="nv_inference_request_success{model=\"$1\"" 'index($0, m) == 1 {print $2}'; }
server=$(pgrep -f "bin/tritonserver.*$work")
for model in minilm minilm_zero; do
  stub=$(pgrep -f "$work/$model/1/model.py")
  for concurrency in 1 4; do
    a=$(ticks "$stub"); s=$(ticks "$server"); r=$(answered $model); t0=$(date +%s.%N)
    .venv/bin/python -m tools.load -m $model -u localhost:18001 --dataset glue:RTE \
        --tokenizer ~/.cache/dvabatch/sources/minilm.tokenizer.json --concurrency-range $concurrency \
        -p 8000 --max-trials 3 > /dev/null 2>&1 || true
    b=$(ticks "$stub"); s2=$(ticks "$server"); r2=$(answered $model); t1=$(date +%s.%N)
    python3 -c "n = $r2 - $r; print('$model, concurrency $concurrency: %d requests in %.1f s (%.1f/s); '
                'stub CPU %.2f ms/request, tritonserver CPU %.2f ms/request'
                % (n, $t1 - $t0, n / ($t1 - $t0), ($b - $a) * 10 / n, ($s2 - $s) * 10 / n))"
  done
done
