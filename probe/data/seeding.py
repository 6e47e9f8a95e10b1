"""Seeded randomness keyed by what it is for, so that every model, condition and process sees the same draws."""

from __future__ import annotations

import hashlib

import torch


def keyed_generator(*key) -> torch.Generator:
    """A CPU generator seeded from a tuple key, e.g. (seed, batch, layer): the same key gives the same draws."""
    digest = hashlib.blake2b(":".join(map(str, key)).encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") % (2**63))
