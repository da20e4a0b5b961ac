"""``python -m tools.compare``: DVABatch against Triton's own batcher, as the paper's evaluation."""
