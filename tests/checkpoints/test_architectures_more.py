"""The other half of the coverage table's entries (tests/checkpoints/test_architectures.py has the first)."""

from __future__ import annotations

import pytest

from tests.checkpoints.test_architectures import TABLE, same_transformers, shard
from tests.support import parity


@same_transformers
@pytest.mark.parametrize("model_type", shard(1))
def test_entry_still_holds(model_type):
    parity.check_entry(model_type, TABLE)
