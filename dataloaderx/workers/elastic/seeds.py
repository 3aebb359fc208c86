"""Each batch's seed in an elastic pool: from the base seed, the epoch and the batch's place in
it, so that the same seed gives the same batches whatever number of workers made them."""

from __future__ import annotations

import hashlib

__all__ = ["batch_seed"]


def batch_seed(base_seed: int, epoch: int, batch: int) -> int:
    """The 64-bit seed of batch number ``batch`` of epoch ``epoch``, from ``base_seed``."""
    digest = hashlib.blake2b(f"{base_seed}:{epoch}:{batch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
