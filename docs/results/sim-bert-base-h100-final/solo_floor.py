"""The floor of the mean latency on GLUE RTE with the simulated H100 BERT-base tables: every
query alone, no queueing, no overhead. Run from the repository root:

    .venv/bin/python docs/results/sim-bert-base-h100-final/solo_floor.py
"""

import json
import statistics
from pathlib import Path

from tokenizers import Tokenizer

from backend.manifest import LatencyTable
from tools.load.workload import glue_texts

profile = json.loads(Path("docs/profiles/bert_base_h100_2stages.json").read_text())
stages = [LatencyTable.from_json(stage["latency"]) for stage in profile["stages"]]
whole = LatencyTable.from_json(profile["whole"]["latency"])
tokenizer = Tokenizer.from_file(str(Path.home() / ".cache/dvabatch/sources/minilm.tokenizer.json"))
tokenizer.no_padding()
tokenizer.enable_truncation(128)
lengths = [len(tokenizer.encode(*texts).ids) for texts in glue_texts("RTE")]
for name, read in (("read between lengths (now)", "predict"), ("rounded up (before)", "lookup")):
    pipeline = statistics.mean(sum(getattr(t, read)(1, n) for t in stages) for n in lengths)
    alone = statistics.mean(getattr(whole, read)(1, n) for n in lengths)
    print(f"{len(lengths)} RTE queries, tables {name}: one query alone through the two stages "
          f"{pipeline:.2f} ms on average, through the whole model {alone:.2f} ms")
