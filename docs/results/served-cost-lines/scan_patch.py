"""The scan's scratch patch to backend/serving.py (never committed; `git checkout
backend/serving.py` undoes it). Environment of tritonserver: START_MODE=plain starts `auto`
plain, FREEZE_MODE=1 keeps the mode it started in (the switch still predicts and learns),
NO_LONE=1 runs no lone batch inline; every window logs the stub's CPU a request, the rows a
run, the calls and the lone batches run inline."""

from pathlib import Path

path = Path(__file__).resolve().parents[3] / "backend" / "serving.py"
text = path.read_text()
for old, new in (
    ("        runtime.watch = Watch(",
     "        if os.environ.get('START_MODE', 'pipeline') == 'plain':\n"
     "            switch.mode = runtime.mode = switch.plain\n        runtime.watch = Watch("),
    ("                changed = self.switch.observe(window, trial=self.entry is not None and self.entry.trying)",
     "                changed = self.switch.observe(window, trial=self.entry is not None and self.entry.trying)\n"
     "                if os.environ.get('FREEZE_MODE'):\n"
     "                    changed, self.switch.trying, self.switch.mode = None, None, self.runtime.mode\n"),
    ("        runtime.lone = LoneRuns.of(manifest, costs)",
     "        runtime.lone = None if os.environ.get('NO_LONE') else LoneRuns.of(manifest, costs)"),
    ("            before = now\n            if changed is not None:",
     "            before = now\n            if window.answered:\n"
     "                self._said(f'WINDOW {self.runtime.mode.value} waits={self.runtime.wait_s > 0} '\n"
     "                           f'obs {window.stub_s / window.answered * 1e6:.1f} us/req rows {window.rows:.1f} '\n"
     "                           f'execs {window.executes} inline {window.inline} ans {window.answered}: '\n"
     "                           f'{self.switch.last}')\n"
     "            if changed is not None:"),
):
    assert old in text, old
    text = text.replace(old, new, 1)
path.write_text(text)
