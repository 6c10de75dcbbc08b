"""Argument checks of the command line: every option is checked before any work starts.

:class:`Parser` is argparse's parser with one change: an error is ONE line on
stderr, ``flash-numba bench: error: argument --csv: directory /no/such/dir does
not exist``, exit status 2, no usage block and no traceback.  The ``type=``
functions here (:func:`integer`, :func:`output_file`, :func:`output_dir`) make
argparse refuse a bad value while it parses, naming the option; checks that
need several options (a block that fits the head dim and dtype) call
``parser.error`` with a message that starts with the option's name.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

#: Largest head dim d the kernels take.
MAX_D = 128


class Parser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are one line: ``PROG: error: MESSAGE``, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def integer(low: int, high: int | None = None):
    """An argparse ``type``: an int in ``[low, high]`` (no upper bound when ``high`` is None)."""
    want = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {want}, got {value}")
        return value

    return parse


#: argparse types of the numbers every tool takes.
positive = integer(1)
non_negative = integer(0)
head_dim = integer(1, MAX_D)


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _writable_dir(path: Path) -> None:
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"directory {path} is not writable")


def output_file(text: str) -> str:
    """An argparse ``type``: a file to write, in a directory that exists and is writable.

    An existing file is overwritten (it must be writable); a directory is refused.
    """
    path = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("expected a file name, got ''")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a directory, not a file")
    parent = path.parent
    if not parent.exists():
        raise argparse.ArgumentTypeError(f"directory {parent} does not exist")
    _writable_dir(parent)
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"{path} is not writable")
    return text


def output_dir(text: str) -> str:
    """An argparse ``type``: a directory to write into, made (with its parents) by :func:`make_dir` if missing.

    It must be a directory if it exists, else its nearest existing ancestor
    must be a writable directory.
    """
    if not text:
        raise argparse.ArgumentTypeError("expected a directory, got ''")
    path = Path(text)
    existing = next(p for p in (path, *path.parents) if p.exists())  # "." or "/" at the latest
    if existing != path and not existing.is_dir():
        raise argparse.ArgumentTypeError(f"cannot make {path}: {existing} is not a directory")
    _writable_dir(existing)
    return text


def make_dir(parser: argparse.ArgumentParser, option: str, path) -> Path:
    """Make the checked directory ``path`` (:func:`output_dir`) now; a failure is ``parser.error``."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"argument {option}: cannot make {path}: {exc.strerror or exc}")
    return Path(path)
