"""The error ``dataloaderx bench`` reports as a one-line message with exit code 2."""

from __future__ import annotations

__all__ = ["BenchError"]


class BenchError(Exception):
    """A problem with the command's input: a bad argument, dataset or step."""
