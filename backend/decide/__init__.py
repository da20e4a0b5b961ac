"""How a model serves, decided in one place, from what is measured where it runs.

Three questions, each answered from the stage latency tables and the host's serving costs
(``HostCosts``: measured when the model loads, ``calibrate.py``; corrected while it serves by
what serving shows), never from a cost measured on another machine:

- **Pipeline or plain** (``choose``; ``ModeSwitch`` while serving). Stages that compute on the
  host's cores (ONNX Runtime; torch on a CPU instance) only take turns on them, so the pipeline
  pays there only where splitting a batch after a stage answers its rows sooner (Policy II):
  otherwise the stages run fused, as a plain model does, decided once. Stages on engines that
  overlap (a GPU; timed) start pipelined, the paper's multi-entry, unless loading's costs say
  plain answers sooner both alone and at capacity (``ModeSwitch.begin``); the ``ModeSwitch`` then
  watches each second of serving and runs every batch inside ``execute`` (as a plain model
  does: the whole model as one engine where it fuses, ``fuses``, else the stages in turn)
  while that answers the load seen sooner (the
  pipeline's own cost, the stub's one interpreter, the host's cores, the bottleneck stage,
  weighed against the waits its multi-entry saves), and pipelines again when it does not.
- **Whether a pipeline's ``execute`` waits** until stage 0 computed its queries (``waits``): where
  the host's CPU caps the pipeline, so that Triton batches what arrives meanwhile; under ``auto``
  decided again from each window served pipelined (``EntryWait``).
- **Whether a lone batch runs inside ``execute``** (``LoneRuns``): only under ``auto`` (or where
  ``lone_inline`` asks), and only while the looks say a request rarely arrives during one, by
  what the pipeline's hand-offs cost here against what such a request would wait.

What is decided when the model loads is in ``load.py``, a lone batch in ``lone.py``, what a
window of serving shows in ``window.py``, the trials in ``trial.py`` and the mode switch in
``switch.py``; ``costs.py`` holds what they share. Nothing here imports Triton, so every rule
can be tested directly.
"""

from .costs import HostCosts, Mode, way
from .load import Choice, capacities, choose, fuses, interpreted, waits
from .lone import LoneRuns
from .switch import ModeSwitch, ServedLine
from .trial import EntryWait, Trial
from .window import MIN_ANSWERS, Window, beyond_first, measured_s, round_trip_s

__all__ = ["MIN_ANSWERS", "Choice", "EntryWait", "HostCosts", "LoneRuns", "Mode", "ModeSwitch", "ServedLine", "Trial",
           "Window", "beyond_first", "capacities", "choose", "fuses", "interpreted", "measured_s", "round_trip_s",
           "waits", "way"]
