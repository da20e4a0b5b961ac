"""A model directory replaced in one step, so that a tritonserver polling its repository
(``--model-control-mode=poll``) sees the old model or the new one, never a mix of the two nor no
model at all (which would unload it).

The new model is built complete (stages, manifest, config.pbtxt) in a scratch folder on the same
filesystem, then exchanged with ``OUT`` by one ``renameat2(RENAME_EXCHANGE)`` (Linux 3.15 and
later, on the filesystems that support it): both names exist throughout, and the old model ends up
in the scratch folder, removed after. Where the exchange is not supported, two renames with
nothing between them (``OUT`` is missing for that instant).

The scratch folder goes beside the model repository (the parent of ``OUT``'s parent) where that is
writable and on the same filesystem: Triton takes every folder of its repository for a model
(hidden ones too) and would try to load the scratch as one, and every file written inside ``OUT``
would make it reload the model being replaced. Otherwise it goes beside ``OUT``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import tempfile
from pathlib import Path

PREFIX = ".dvabatch-slicing-"  # a scratch folder's name starts so (one a killed run left is recognised)
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def scratch_for(out: Path) -> Path:
    """A new, empty scratch folder on ``out``'s filesystem, outside ``out``'s repository where possible."""
    parent = out.parent.resolve()
    for place in (parent.parent, parent):
        try:
            if place.stat().st_dev == parent.stat().st_dev and os.access(place, os.W_OK):
                return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{out.name}-", dir=place))
        except OSError:
            continue
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{out.name}-", dir=parent))


def swap_in(new: Path, out: Path) -> None:
    """Make ``new`` (a complete model folder) ``out``; the old ``out``, if any, is left at ``new``."""
    if not out.exists():
        new.rename(out)
        return
    if _exchange(new, out):
        return
    old = new.with_name(new.name + ".old")
    out.rename(old)
    new.rename(out)
    old.rename(new)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically; False where this system cannot."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError, TypeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    done = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return done == 0
