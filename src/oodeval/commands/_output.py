"""``--format table|csv|json``: how a command writes its result rows to stdout (one spelling for
``evaluate``, ``score``, ``metrics`` and ``run``).

``table`` is the text table of :func:`oodeval.evaluation.format_table`; ``csv`` and ``json`` are the
rows themselves (fractions; a missing value is an empty CSV field or JSON ``null``), so the output
pipes into pandas, ``jq`` or a spreadsheet. With csv/json everything else a command prints goes
to stderr, keeping stdout parseable.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from ..errors import InputError
from ..evaluation import format_table

__all__ = ["FORMATS", "add_format", "info", "write_rows"]

FORMATS = ("table", "csv", "json")


def add_format(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--format", choices=FORMATS, default="table",
                   help=f"how {what} go to stdout: table (text, default), csv or json (every column, fractions; "
                   "other messages then go to stderr)")  # fmt: skip


def info(fmt: str) -> TextIO:
    """Where a command's other messages go: stdout with a text table, stderr with csv/json."""
    return sys.stdout if fmt == "table" else sys.stderr


def _plain(value: object) -> object:
    """A JSON value: numpy scalars as Python ones (floats exact), NaN / NA as None."""
    import pandas as pd

    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if value is None or (not isinstance(value, str | list | dict) and pd.isna(value)):
        return None
    return value


def write_rows(rows: list[dict], fmt: str, convention: str = "paper", stream: TextIO | None = None) -> None:
    """``rows`` to ``stream`` (default stdout) as ``fmt``; a table by :func:`oodeval.evaluation.format_table`."""
    import pandas as pd


    stream = sys.stdout if stream is None else stream
    if fmt == "table":
        print(format_table(rows, convention), file=stream)
    elif fmt == "csv":
        pd.DataFrame(rows).to_csv(stream, index=False)
    elif fmt == "json":
        records = [{k: _plain(v) for k, v in r.items()} for r in pd.DataFrame(rows).to_dict("records")]
        stream.write(json.dumps(records, allow_nan=False) + "\n")
    else:
        raise InputError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
