"""Timed-engine profiles from two published figures: a batch's time grows by a fixed cost plus
a cost per row (``python -m tools.engine_profile``)."""

from __future__ import annotations


BERT_INPUTS = [{"name": name, "dtype": "int64", "dims": ["sequence"]}
               for name in ("input_ids", "attention_mask", "token_type_ids")]


def line(one_ms: float, full_ms: float, full_rows: int) -> tuple[float, float]:
    """(fixed ms, ms per row) of the line through one row and ``full_rows`` rows."""
    if full_rows < 2 or full_ms < one_ms or one_ms < 0:
        raise ValueError("need --full-rows >= 2 and 0 <= --one-ms <= --full-ms")
    per_row = (full_ms - one_ms) / (full_rows - 1)
    return one_ms - per_row, per_row


def table(fixed: float, per_row: float, at_length: int, max_batch_size: int, lengths: list[int]) -> dict:
    batch_sizes = list(range(1, max_batch_size + 1))
    return {"unit": "ms", "batch_sizes": batch_sizes, "axis": "sequence", "lengths": lengths,
            "mean": [[round(fixed + per_row * rows * length / at_length, 4) for rows in batch_sizes]
                     for length in lengths]}


def fractions(shares: list[float] | None, stages: int, what: str) -> list[float]:
    """Each stage's fraction of a cost: ``shares`` scaled to sum to 1, or equal parts."""
    if shares is None:
        return [1 / stages] * stages
    if len(shares) != stages or min(shares) < 0 or sum(shares) <= 0:
        raise ValueError(f"{what} needs {stages} shares (one a stage), none negative, not all 0")
    return [share / sum(shares) for share in shares]


def profile(name: str, one_ms: float, full_ms: float, full_rows: int, at_length: int = 128, stages: int = 2,
            max_batch_size: int = 64, lengths: list[int] | None = None, source: str = "",
            fixed_shares: list[float] | None = None, row_shares: list[float] | None = None) -> dict:
    """Stage ``i`` takes ``fixed_shares[i]`` of the launch cost and ``row_shares[i]`` of the work a
    row: shares that differ are the paper's operator diversity (a stage heavy in fixed cost
    prefers large batches, one heavy in work a row gains little from them)."""
    lengths = lengths or [16, 32, 64, 128]
    fixed, per_row = line(one_ms, full_ms, full_rows)
    fixed_parts = fractions(fixed_shares, stages, "--fixed-shares")
    row_parts = fractions(row_shares, stages, "--row-shares")
    described = (f"{one_ms} ms for 1 row, {full_ms} ms for {full_rows} rows at {at_length} tokens, "
                 "linear in rows x tokens")
    if fixed_shares or row_shares:
        described += (f"; stages take {'/'.join(f'{f:.2f}' for f in fixed_parts)} of the fixed cost and "
                      f"{'/'.join(f'{r:.2f}' for r in row_parts)} of the work a row")
    return {"name": name, "source": source or described,
            "max_batch_size": max_batch_size, "inputs": BERT_INPUTS,
            "stages": [{"latency": table(fixed * f, per_row * r, at_length, max_batch_size, lengths)}
                       for f, r in zip(fixed_parts, row_parts)],
            "whole": {"latency": table(fixed, per_row, at_length, max_batch_size, lengths)}}
