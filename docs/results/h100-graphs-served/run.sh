#!/usr/bin/env bash
# One device call: issue 37's GPU run (host.sh gpu: check setup models gpu_test cost engine archive).
set -u
mkdir -p /tmp/b; tar xf .bundle/dvabatch-gpu.tar.xz -C /tmp/b
echo "== $(date +%T) start"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 500 /tmp/b/dvabatch-gpu/host.sh --project "$PWD" --out /tmp/r gpu > /tmp/r.log 2>&1; echo "host.sh rc=$?"
cp /tmp/r.log /tmp/r/ 2>/dev/null || { mkdir -p /tmp/r; cp /tmp/r.log /tmp/r/; }
tail -60 /tmp/r.log
find /tmp/r -name '*.onnx' -o -name '*.plan' -o -name '*.pt' | xargs rm -f
tar czf $OUT/r.tar.gz -C /tmp r; ls -la $OUT
