"""The other half of the families of tests/cli/test_verbs_per_family.py."""

from __future__ import annotations

import pytest

from tests.cli.test_verbs_per_family import check_every_verb, shard


@pytest.mark.parametrize("model_type", shard(1))
def test_every_verb_runs(model_type, tmp_path):
    check_every_verb(model_type, tmp_path)
