"""The slicer's one error type."""


class SliceError(ValueError):
    """The model cannot be sliced as asked; the message says why."""
