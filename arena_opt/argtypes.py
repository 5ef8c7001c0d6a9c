"""Flag value types for argparse: the parser itself rejects a negative count, a NaN or an infinity, with
a message that names the flag and the value (argparse prefixes the flag; exit 2, no traceback)."""

from __future__ import annotations

import argparse
import math
import re
import sys


def _number(text: str, kind: type) -> float | int:
    try:
        v = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: {text!r}") from None
    if kind is float and not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number (value {text!r})")
    return v


def bounded(kind: type, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
            hi_open: bool = False):
    """A type function for `kind` (int or float, finite) within [lo, hi] (open ends as given)."""

    def parse(text: str):
        v = _number(text, kind)
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise argparse.ArgumentTypeError(f"must be {'>' if lo_open else '>='} {lo:g} (value {v!r})")
        if hi is not None and (v > hi or (hi_open and v == hi)):
            raise argparse.ArgumentTypeError(f"must be {'<' if hi_open else '<='} {hi:g} (value {v!r})")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its message: "invalid int value"
    return parse


finite_float = bounded(float)
band_quantile = bounded(float, 0.5, 1, hi_open=True)  # a quantile of an error band at or above its median
positive_float = bounded(float, 0, lo_open=True)
nonneg_float = bounded(float, 0)
positive_int = bounded(int, 0, lo_open=True)
nonneg_int = bounded(int, 0)
fraction = bounded(float, 0, 1)
seed = bounded(int, 0, 2**32 - 1)  # numpy seeds


class Parser(argparse.ArgumentParser):
    """argparse with messages in the CLI's one form, `--flag must be > 0 (value 0)`; its subcommand
    parsers are of this class too."""

    def error(self, message: str):
        message = re.sub(r"^argument ([^:]+): (must be|not an? )", r"\1 \2", message)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")
