#!/usr/bin/env bash
set -u
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
mkdir -p "$OUT/d" /tmp/b; tar xf .bundle/dvabatch-gpu.tar.xz -C /tmp/b
HOSTPY=$(command -v python3)
H="/tmp/b/dvabatch-gpu/host.sh --project $PWD --out $OUT/d"
{ df -h /dev/shm; ulimit -a | head -20; nproc; } > "$OUT/d/host.txt" 2>&1
stamp setup; $H check setup > "$OUT/d/setup.log" 2>&1 || { tail -20 "$OUT/d/setup.log"; exit 1; }
eval "$(/tmp/b/dvabatch-gpu/host.sh --project $PWD env)"
R=/tmp/b/dvabatch-gpu/work/repository
stamp models; timeout 100 $HOSTPY -m tools.models bert_base --target torch --device cuda --precision fp16 --max-batch-size 64 \
  --repository $R 2>&1 | grep -v -i warn | tail -5; stamp "models done"
ls $R/bert_base > "$OUT/d/files.txt"; cat $R/bert_base/config.pbtxt >> "$OUT/d/files.txt" 2>&1
stamp bench; timeout 80 python3 -m tools.bench_cost $R/bert_base --models plain,auto --concurrency 64 --rounds 1 --seconds 2 \
  --out "$OUT/d/cost" > "$OUT/d/bench.log" 2>&1; stamp "bench rc $?"
df -h /dev/shm >> "$OUT/d/host.txt"; ls -la /dev/shm | tail -20 >> "$OUT/d/host.txt"
tail -c 300000 "$OUT/d/cost/tritonserver-bert_base.log" > "$OUT/d/triton-tail.log" 2>/dev/null
rm -rf "$OUT/d/cost"; cd "$OUT" && tar czf diag.tgz d && rm -rf d; stamp done
