"""The floor of the mean latency on GLUE RTE with the simulated H100 BERT-base tables: every
query alone, no queueing, no overhead. Run from the repository root:

    .venv/bin/python docs/results/sim-bert-base-h100-final/solo_floor.py
"""

import json
import statistics
from pathlib import Path

from backend.manifest import LatencyTable, TensorSpec
from tools.lib.workload import ModelInterface, glue

profile = json.loads(Path("docs/profiles/bert_base_h100_2stages.json").read_text())
stages = [LatencyTable.from_json(stage["latency"]) for stage in profile["stages"]]
whole = LatencyTable.from_json(profile["whole"]["latency"])
inputs = tuple(TensorSpec.from_json(t) for t in profile["inputs"])
interface = ModelInterface("bert", profile["max_batch_size"], inputs, ())
tokenizer = Path.home() / ".cache/dvabatch/sources/minilm.tokenizer.json"
lengths = [request.length for request in glue(interface, "glue:RTE", tokenizer)]
for name, read in (("read between lengths (now)", "predict"), ("rounded up (before)", "lookup")):
    pipeline = statistics.mean(sum(getattr(t, read)(1, n) for t in stages) for n in lengths)
    alone = statistics.mean(getattr(whole, read)(1, n) for n in lengths)
    print(f"{len(lengths)} RTE queries, tables {name}: one query alone through the two stages "
          f"{pipeline:.2f} ms on average, through the whole model {alone:.2f} ms")
