"""CSV files that carry their provenance: ``# `` comment lines (device, date, conventions), then a table.

Every tool writes its data this way (bench, figures, profile); :func:`read_csv`
reads the table back and :func:`read_comments` the lines above it.
"""

from __future__ import annotations

import csv
from pathlib import Path


def write_csv(path, comments: list, rows: list, fields=None) -> Path:
    """``rows`` (dicts) as CSV under one ``# `` line per comment; returns ``path``.

    Columns: ``fields`` when given, else every key in first-seen order.  A
    missing value is an empty cell, and so is ``None``.
    """
    fields = list(fields) if fields is not None else list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        for line in comments:
            f.write(f"# {line}\n")
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    return Path(path)


def read_csv(path) -> list:
    """The table of a file from :func:`write_csv` as a list of dicts (strings)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def read_comments(path) -> list:
    """The comment lines of a file from :func:`write_csv`, without their ``# ``."""
    with open(path, newline="") as f:
        return [line[2:].rstrip("\n") for line in f if line.startswith("# ")]
