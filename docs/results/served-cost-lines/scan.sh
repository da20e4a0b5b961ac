#!/bin/bash
# scan.sh PROFILE TAG: each way held from 1 to 64 in flight (run from the repository root, after
# scan_patch.py); logs to /tmp/scan-TAG-{plain,pipeline}.log
here=$(dirname "$0")
for mode in plain pipeline; do
  START_MODE=$mode FREEZE_MODE=1 NO_LONE=1 DVABATCH_CLIENT_CPUS=0 .venv/bin/python "$here/replay.py" "$1" \
    1:5,4:5,16:5,64:5 "/tmp/scan-$2-$mode.log" auto > "/tmp/scan-$2-$mode.out" 2>&1
done
