"""CSV files that carry their provenance: ``# `` comment lines (device, date, conventions), then a table.

Every tool writes its data this way (bench, figures, profile); :func:`read_csv`
reads the table back and :func:`read_comments` the lines above it.  A
:class:`RowWriter` writes such a file one row at a time, each row flushed as it
comes, so that a sweep that fails or is interrupted keeps the rows it measured.
"""

from __future__ import annotations

import csv
from pathlib import Path


class RowWriter:
    """An open CSV file: one ``# `` line per comment and the header on opening, then :meth:`write`
    appends a row (a dict over ``fields``) and flushes it to the file at once.

    A missing value is an empty cell, and so is ``None``.  Use it as a context
    manager; the file is closed however the block ends.
    """

    def __init__(self, path, comments: list, fields):
        self.path = Path(path)
        self.rows = 0
        self._file = open(path, "w", newline="")
        for line in comments:
            self._file.write(f"# {line}\n")
        self._writer = csv.DictWriter(self._file, fieldnames=list(fields))
        self._writer.writeheader()
        self._file.flush()

    def write(self, row: dict) -> None:
        self._writer.writerow({k: "" if v is None else v for k, v in row.items()})
        self._file.flush()
        self.rows += 1

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_csv(path, comments: list, rows: list, fields=None) -> Path:
    """``rows`` (dicts) as CSV under one ``# `` line per comment (a :class:`RowWriter`); returns ``path``.

    Columns: ``fields`` when given, else every key in first-seen order.
    """
    fields = list(fields) if fields is not None else list(dict.fromkeys(k for row in rows for k in row))
    with RowWriter(path, comments, fields) as out:
        for row in rows:
            out.write(row)
    return Path(path)


def read_csv(path) -> list:
    """The table of a file from :func:`write_csv` as a list of dicts (strings)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def read_comments(path) -> list:
    """The comment lines of a file from :func:`write_csv`, without their ``# ``."""
    with open(path, newline="") as f:
        return [line[2:].rstrip("\n") for line in f if line.startswith("# ")]
