"""The errors of a model's configuration and of an engine's slicer target: the first shared by
the knobs (``config.py``) and the policies that check their own settings (``policy.py``,
``diversity.py``), which ``config.py`` builds; the second by the engines (``engines/``), whose
slicer targets the slicer reports as its own errors. Apart from all of them, so that none
imports another for its error."""


class ConfigError(ValueError):
    """A model's config.pbtxt parameter is invalid; the message names it."""


class TargetError(ValueError):
    """An engine's slicer target cannot build or profile this model here; the message says why."""
