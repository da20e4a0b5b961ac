"""What the commands share at their edges: comma-separated options (``--loads 0.1,0.5,0.9``,
``--models plain,auto``) parsed by argparse itself (``type=``), so that a typo is a usage error
that names the option and what it takes, not a traceback from the middle of a benchmark's
set-up; and the console their tables print on."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

PIPED_WIDTH = 200  # columns of a table printed into a pipe or a log (rich would cut it to 80)


def table_console() -> Console:
    """The terminal's width on a terminal; ``PIPED_WIDTH`` columns where the output is piped (a
    log, CI, a test), where rich's default of 80 folds every table cell into a column of words."""
    return Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)


def numbers(kind: type[int] | type[float], empty: bool = False) -> Callable[[str], tuple]:
    """A parser of ``1,16,64`` into a tuple of ``kind`` (sizes, rates, loads: each above zero),
    at least one unless ``empty`` (then ``""`` is none)."""
    what = "integers" if kind is int else "numbers"

    def parse(text: str) -> tuple:
        try:
            values = tuple(kind(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes comma-separated {what}, got {text!r}") from None
        if any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"takes {what} above 0, got {text!r}")
        if not values and not empty:
            raise argparse.ArgumentTypeError(f"takes at least one of its comma-separated {what}, got {text!r}")
        return values

    return parse


def pairs(text: str) -> tuple[tuple[float, float], ...]:
    """A parser of ``0.1/0.8,0.2/0.6`` into pairs of numbers above zero (``check_auto
    --bursts``: LOW/HIGH); ``""`` is none."""
    try:
        found = tuple(tuple(float(v) for v in pair.split("/")) for pair in text.split(",") if pair.strip())
    except ValueError:
        found = ((),)
    if any(len(pair) != 2 or min(pair) <= 0 for pair in found):
        raise argparse.ArgumentTypeError(f"takes comma-separated LOW/HIGH pairs of numbers above 0, got {text!r}")
    return found


def served(text: str) -> Path:
    """A parser of what the benchmarks serve: a timed profile (a JSON file) or a sliced model
    directory, which must be there (a path mistyped would fail minutes in, at the first model's
    set-up, as a traceback)."""
    path = Path(text)
    if path.is_dir() or (path.is_file() and path.suffix == ".json"):
        return path
    raise argparse.ArgumentTypeError(f"{text}: no timed profile (a .json file) or sliced model directory there "
                                     "(the timed profiles are in docs/profiles)")


def names(known: Sequence[str], empty: bool = False) -> Callable[[str], tuple[str, ...]]:
    """A parser of ``a,b`` into a tuple of names, each one of ``known``, at least one unless
    ``empty``."""

    def parse(text: str) -> tuple[str, ...]:
        chosen = tuple(v.strip() for v in text.split(",") if v.strip())
        unknown = [v for v in chosen if v not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"{', '.join(map(repr, unknown))} unknown; it takes some of "
                                             f"{','.join(known)}")
        if not chosen and not empty:
            raise argparse.ArgumentTypeError(f"takes at least one of {','.join(known)}")
        return chosen

    return parse


def add_lengths_argument(parser: argparse.ArgumentParser) -> None:
    """``--length 64[,...]``: the tokens each query carries (``args.length``, a list); several
    give input diversity: successive queries take them in turn."""
    parser.add_argument("--length", type=numbers(int), default="64",
                        help="tokens per query (default 64); several: successive queries take them in turn, "
                             "and the plain model pads a batch to its longest")


def add_fill_argument(parser: argparse.ArgumentParser) -> None:
    """``--fill NAME=VALUE``, repeatable: every synthetic query's input NAME holds VALUE throughout
    (``dict(args.fill)``): a timed profile's ``work`` input, say, which scales each batch's time
    (``--fill work=16``: every batch takes 16x its tables' time)."""
    def pair(text: str) -> tuple[str, float]:
        name, equals, value = text.partition("=")
        try:
            if not equals or not name.strip():
                raise ValueError
            return name.strip(), float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes NAME=NUMBER, got {text!r}") from None
    parser.add_argument("--fill", type=pair, action="append", default=[], metavar="NAME=VALUE",
                        help="synthetic data: input NAME holds VALUE in every query (e.g. a timed profile's "
                             "work=16: each batch takes 16x its tables' time); repeatable")


def count(least: int, refusal: str) -> Callable[[str], int]:
    """An argparse type: an integer of ``least`` or more, else a usage error saying ``refusal``
    (formatted with ``text``, what was given)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes an integer, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(refusal.format(text=text))
        return value
    return parse


# Rounds a model's life holds by default (``--reload-every``): one. A life costs a reload (some 3 s a model
# on this 2-core host, its warm-up included) beside a round's window (some 4 s), but the interval is
# a t interval over lives, read at several looks: on near-zero compute 18 lives of one round read
# 0.99x [0.96, 1.02] and 0.96x [0.93, 0.99], where 4 lives of three rounds read 1.04x [0.92, 1.17]
# (docs/results/check-one-round-lives).
RELOAD_EVERY = 1


def add_reload_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--reload-every N``: load every model afresh after each N rounds (``RELOAD_EVERY``) and
    read ``what`` over these lives (``args.reload_every``; 0 loads once); a negative count is a
    usage error."""
    parser.add_argument("--reload-every", type=count(0, "{text}: a number of rounds, or 0 to load each model once"),
                        default=RELOAD_EVERY, metavar="N",
                        help=f"load every model afresh after each N rounds, and read {what} over these lives "
                             f"(default {RELOAD_EVERY}; 0: load once)")


def add_bursts_arguments(parser: argparse.ArgumentParser, rates: str, example: str) -> None:
    """``--bursts LOW/HIGH[,...]`` (``args.bursts``: pairs of ``rates``; none by default) and
    ``--burst-seconds`` (how long each rate lasts, ``args.burst_seconds``: 2 s by default): loads
    that alternate between two Poisson rates (``perf_analyzer.write_bursts``). A phase of no length
    is a usage error."""
    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes seconds, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text}: a rate must last some time")
        return value
    parser.add_argument("--bursts", type=pairs, default="",
                        help=f"loads that alternate between two Poisson rates, {rates}, LOW/HIGH[,LOW/HIGH...] "
                             f"(e.g. {example}; default: none)")
    parser.add_argument("--burst-seconds", type=seconds, default=2.0,
                        help="how long each rate of --bursts lasts (default 2)")


def add_request_rows_argument(parser: argparse.ArgumentParser) -> None:
    """``--request-rows N``: the rows each request carries, as a client that batches its own
    (perf_analyzer's ``-b``; ``args.request_rows``, 1 by default); a count of 0 is a usage error."""
    rows = count(1, "takes an integer above 0: a request has one row at least, got {text!r}")
    parser.add_argument("--request-rows", type=rows, default=1, metavar="N",
                        help="rows each request carries, as a client that batches its own (perf_analyzer's -b; "
                             "default 1); the figures count requests")


def add_parameter_argument(parser: argparse.ArgumentParser, whose: str, example: str = "buffer_pairs=2") -> None:
    """``--parameter KEY=VALUE``, repeatable: a config.pbtxt parameter of ``whose`` models, on top
    of those the slicer or the profile writes; ``dict(args.parameter)`` holds them."""
    def pair(text: str) -> tuple[str, str]:
        key, equals, value = text.partition("=")
        if not equals or not key.strip():
            raise argparse.ArgumentTypeError(f"takes KEY=VALUE, got {text!r}")
        return key.strip(), value
    parser.add_argument("--parameter", type=pair, action="append", default=[], metavar="KEY=VALUE",
                        help=f"a config.pbtxt parameter of {whose} (e.g. {example}); repeatable")
