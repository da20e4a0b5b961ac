"""The `dvabatch` Triton backend: model.py is Triton's entry point, the runtime lives beside it."""
