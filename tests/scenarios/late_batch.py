"""A batch type whose module the scenario's parent process first imports in a producer thread.

``fork_during_import.py`` never imports this module in its main thread: its workers import
it to build items, and the parent imports it when it unpickles the first batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Tagged(NamedTuple):
    value: torch.Tensor
