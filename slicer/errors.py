"""The slicer's one error type."""


class SliceError(ValueError):
    """The model cannot be sliced as asked; the message says why."""


def plural(n: int, noun: str) -> str:
    """``1 legal cut point``, ``3 legal cut points``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
