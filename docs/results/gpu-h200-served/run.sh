#!/usr/bin/env bash
# One lease: setup, models (FP16), GPU tests, served cost of both models, check_auto on the host's CPU.
set -u
T0=$(date +%s); END=$((T0 + ${BUDGET:-575}))
left() { echo $(( END - $(date +%s) )); }
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/r/steps.log"; }
mkdir -p "$OUT/r" /tmp/b
tar xf .bundle/dvabatch-gpu.tar.xz -C /tmp/b
H="/tmp/b/dvabatch-gpu/host.sh --project $PWD --out $OUT/r"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/r/gpu.txt" 2>&1
stamp check-setup; $H check setup > "$OUT/r/setup.log" 2>&1 || { stamp "setup failed"; tail -30 "$OUT/r/setup.log"; exit 1; }
stamp models; timeout 200 $H models 2>&1 | grep -v -i "warn" | tail -40 > "$OUT/r/models.log"; stamp "models rc ${PIPESTATUS[0]}"
eval "$(/tmp/b/dvabatch-gpu/host.sh --project $PWD env)"
stamp gpu-tests; DVABATCH_TEST_DEVICE=GPU timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_torch.py > "$OUT/r/gpu-tests.log" 2>&1; stamp "tests rc $?"; tail -8 "$OUT/r/gpu-tests.log"
stamp cost; COST_ROUNDS=1 COST_SECONDS=2 timeout $(( $(left) - 150 )) $H cost > "$OUT/r/cost.log" 2>&1; stamp "cost rc $?"
for p in bert_base_trt_a100_2stages slow_2stages zero_2stages; do
  t=$(( $(left) - 5 )); [ $t -gt 40 ] || break
  stamp "check_auto $p ($t s left)"
  timeout $t python3 -m tools.check_auto docs/profiles/$p.json --concurrency 1,16,64 --loads 0.3,0.9 --seconds 2 --warmup 1 \
    --out "$OUT/r/check-auto-$p" > "$OUT/r/check-auto-$p.log" 2>&1; stamp "check_auto $p rc $?"
done
rm -rf "$OUT/r/work" 2>/dev/null
find "$OUT/r" -name '*.log' -size +2M -exec truncate -s 2M {} \;
stamp done; cat "$OUT/r/steps.log"
