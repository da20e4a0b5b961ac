"""CPU ticks of each Triton Python stub's main thread and of its other threads over SECONDS, by
model (plain, auto, pipeline), summed over the stubs alive meanwhile (scratch for
check-one-round-lives): ``python threads.py SECONDS``."""

import collections
import re
import sys
import time
from pathlib import Path

MODEL = re.compile(r"/(auto|plain|pipeline)/1/model.py")


def stubs() -> dict[int, str]:
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        model = MODEL.search(command)
        if "triton_python_backend_stub" in command and model:
            found[int(proc.name)] = model.group(1)
    return found


def ticks(pid: int) -> dict[int, int]:
    """utime + stime of each thread of ``pid``."""
    found = {}
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            found[int(task.name)] = int(fields[11]) + int(fields[12])
    except OSError:
        pass
    return found


def main(seconds: float) -> None:
    totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])  # model -> [main, others]
    before: dict[tuple[int, int], int] = {}
    end = time.time() + seconds
    while time.time() < end:
        now = {}
        for pid, model in stubs().items():
            for tid, value in ticks(pid).items():
                now[(pid, tid)] = value
                if (pid, tid) in before:
                    totals[model][0 if tid == pid else 1] += value - before[(pid, tid)]
        before = now
        time.sleep(0.25)
    for model, (main_ticks, others) in totals.items():
        print(model, "main", main_ticks, "others", others, f"{others / max(main_ticks, 1):.1%}")


if __name__ == "__main__":
    main(float(sys.argv[1]))
