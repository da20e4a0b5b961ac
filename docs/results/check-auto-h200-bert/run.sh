#!/usr/bin/env bash
# The one device call of check-auto-h200-bert: on a lent GPU machine, from the repository root,
# with the bundle (python -m tools.gpu_bundle --python 3.12 --no-project) carried in .bundle/.
# Every step has its own deadline so that what it measured comes back in $OUT.
set -uo pipefail
START=$(date +%s)
left() { echo $(( START + ${BUDGET:-540} - $(date +%s) )); }
B=/tmp/b W=/tmp/w
mkdir -p "$B" "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
nvidia-smi -L; nproc; git log -1 --format='commit %h %s' 2>/dev/null || true
tar xf .bundle/dvabatch-gpu.tar.xz -C "$B"
H="$B/dvabatch-gpu/host.sh --project $PWD --work $W --out $OUT"
HOSTPY="$(command -v python3)"
$H check setup || exit 2
eval "$($H env)"    # python3 is now the stubs' (numpy<2); the export and slicer run the host's
DVABATCH_TEST_DEVICE=GPU timeout 70 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_torch.py 2>&1 | tail -5
echo "== models at $(( $(date +%s) - START )) s"
timeout 150 "$HOSTPY" -m tools.models bert_base --target torch --device cuda --precision fp16 \
    --max-batch-size 64 --repository "$W/repository" > "$OUT/models.log" 2>&1; echo "models rc $?"
tail -3 "$OUT/models.log"
SOURCES=(); for f in "$W"/cache/sources/*.onnx; do SOURCES+=(--source "$f"); done
echo "== check_auto bert_base at $(( $(date +%s) - START )) s"
timeout $(( $(left) - 150 )) python3 -m tools.check_auto "$W/repository/bert_base" "${SOURCES[@]}" \
    --rounds 2 --max-rounds 3 --seconds 2 --warmup 1 --out "$OUT/check-bert_base"
echo "== check_auto near-zero at $(( $(date +%s) - START )) s"
timeout $(( $(left) - 5 )) python3 -m tools.check_auto docs/profiles/zero_2stages.json \
    --rounds 2 --max-rounds 4 --seconds 2 --warmup 1 --out "$OUT/check-zero"
echo "== done at $(( $(date +%s) - START )) s"
