"""The error a model's configuration raises: shared by the knobs (``config.py``) and the
policies that check their own settings (``policy.py``, ``diversity.py``), which ``config.py``
builds, so it lives apart from both."""


class ConfigError(ValueError):
    """A model's config.pbtxt parameter is invalid; the message names it."""
