#!/usr/bin/env bash
# One device call on a lent GPU machine (the GPU unused: timed profiles on the host's CPU), from
# the repository root with the bundle carried in .bundle/ (python -m tools.gpu_bundle --python 3.12
# --no-project). Writes every file into one archive, $OUT/r.tar.gz, and the tables to stdout.
set -u
R=/tmp/r; mkdir -p $R; B=/tmp/dvabatch-gpu
[ -x $B/host.sh ] || tar xf .bundle/dvabatch-gpu.tar.xz -C /tmp
step() { echo "== $(date +%T) $* (at ${SECONDS}s)"; }
step setup
$B/host.sh --project . --out $R/host check setup > $R/setup.log 2>&1; echo "setup rc=$?"
eval "$($B/host.sh --project . --out $R/host env)"
left() { echo $(( ${1} - SECONDS )); }
# 1. issue 38: a fresh tritonserver whose first load is 64 in flight (run 2 of h200-cpu-fresh-start), each window logged
step check
DVABATCH_LOG_WINDOWS=1 DVABATCH_CLIENT_CPUS=0-3 timeout $(left 380) python3 -m tools.check_auto \
    docs/profiles/bert_base_trt_a100_2stages.json --concurrency 64 --loads 0.3,0.6 --rounds 2 --seconds 2 \
    --warmup 1 --out $R/check > $R/check.log 2>&1; echo "check rc=$?"
tail -8 $R/check.log
# 2. issue 40's live cell: smdp against Triton's tuned batcher at 0.5 of the peak, TensorRT speed, in what is left
step dispatch
DVABATCH_CLIENT_CPUS=0-3 timeout $(left 560) python3 -m tools.bench_dispatch docs/profiles/bert_base_trt_a100_2stages.json \
    --loads 0.5 --policies '' --static 64 --rounds 1 --seconds 3 --warmup 1 --out $R/dispatch > $R/dispatch.log 2>&1
echo "dispatch rc=$?"; tail -12 $R/dispatch.log
step archive
tar czf $OUT/r.tar.gz -C /tmp r; ls -la $OUT
