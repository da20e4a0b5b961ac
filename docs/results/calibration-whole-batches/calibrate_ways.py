"""Loading's calibration of one timed model under ``policy: pass`` and ``policy: auto``, in process:
the batches stage 0 ran and the pipelined costs measured (a batch's + a request's, us).

    python docs/results/calibration-whole-batches/calibrate_ways.py MODEL_DIR/auto/1 [--parts]

MODEL_DIR: a folder ``tools.lib.peers.write_ways`` wrote from a timed profile. ``--parts`` hands the
calibration's queries over as queries (as before this run), else as one batch (``whole=True``)."""

import collections
import sys
from pathlib import Path

from backend import calibrate
from backend.config import RuntimeConfig
from backend.device import make_device
from backend.engines import load_engines
from backend.manifest import Manifest
from backend.runtime import Runtime

folder, whole = Path(sys.argv[1]), "--parts" not in sys.argv
for policy in ("pass", "auto"):
    manifest = Manifest.load(folder)
    config = RuntimeConfig.from_parameters({"policy": policy})
    config.bind(manifest)
    device = make_device("CPU")
    runs: collections.Counter = collections.Counter()
    runtime = Runtime(manifest, load_engines(manifest, folder, device), config, device,
                      trace=lambda stage, item, began, ended: runs.update([(stage, item.num)]))
    costs = calibrate.measure(manifest, device, lambda queries: runtime.submit(queries, whole=whole), runtime.plain.run)
    stage0 = {rows: count for (stage, rows), count in sorted(runs.items()) if stage == 0}
    print(f"{policy}: stage 0 ran {stage0} (rows: batches); pipelined "
          f"{costs.pipeline_batch_s * 1e6:.0f} us a batch + {costs.pipeline_request_s * 1e6:.0f} a request")
    runtime.close()
