#!/usr/bin/env bash
# The second call, at once on the same warm machine (run.sh's /tmp/b and /tmp/w still there):
# what auto's near-zero gap costs per request (bench_cost), and BERT-base's Poisson cells again.
set -uo pipefail
START=$(date +%s)
left() { echo $(( START + ${BUDGET:-270} - $(date +%s) )); }
W=/tmp/w
mkdir -p "$OUT"
exec > >(tee "$OUT/run2.log") 2>&1
[ -d "$W/repository/bert_base" ] || { echo "no $W: a fresh machine"; exit 3; }
eval "$(/tmp/b/dvabatch-gpu/host.sh --project "$PWD" --work "$W" env)"
timeout 90 python3 -m tools.bench_cost docs/profiles/zero_2stages.json --models plain,auto --concurrency 1,16 \
    --rounds 2 --seconds 2 --out "$OUT/cost-zero"
SOURCES=(); for f in "$W"/cache/sources/*.onnx; do SOURCES+=(--source "$f"); done
echo "== check_auto bert_base at $(( $(date +%s) - START )) s"
timeout $(( $(left) - 5 )) python3 -m tools.check_auto "$W/repository/bert_base" "${SOURCES[@]}" \
    --concurrency 64 --loads 0.6,0.9,0.3 --rounds 2 --max-rounds 3 --seconds 2 --warmup 1 --out "$OUT/check-bert_base"
echo "== done at $(( $(date +%s) - START )) s"
