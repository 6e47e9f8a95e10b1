"""Representational collapse (docs/definitions.md#collapse): the sequence pairs, zero for identical sequences, the
distance taken from the streams as each dtype holds them, and the bfloat16 rows that a model in bfloat16 gives."""

from __future__ import annotations

import pytest
import torch

from probe.analyses.collapse import BF16_HALF_ULP, collapse, final_stream, sequence_pair, stream_distance
from tests.support.analyses import tiny


def test_sequence_pairs():
    assert sequence_pair(4, 1, 0, "ones") == ([1, 1, 1, 0], [1, 1, 1, 1, 0])
    assert sequence_pair(4, 1, 0, "repeat-last") == ([1, 1, 1, 0], [1, 1, 1, 0, 0])
    with pytest.raises(ValueError, match="ones, repeat-last"):
        sequence_pair(4, 1, 0, "prefix")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_identical_sequences_give_zero(dtype):
    model = tiny().to(dtype)
    s, _ = sequence_pair(12, 5, 7)
    distance, norm = stream_distance(model, s, list(s))
    assert distance == 0.0
    assert norm > 0


def test_distance_is_taken_from_each_dtypes_streams():
    """The bfloat16 row's distance is the float64 norm of the difference of the two bfloat16 streams: every
    coordinate of that difference is a difference of two bfloat16 numbers, so none is below one bfloat16 step at the
    larger of the two magnitudes (a distance taken after rounding the difference again could be)."""
    model = tiny()
    result = collapse(model, [4, 16], 5, 7)["lengths"]
    cast = tiny().to(torch.bfloat16)
    for n in (4, 16):
        s, s2 = sequence_pair(n, 5, 7)
        y = final_stream(cast, torch.tensor([s]))[0].double()
        y2 = final_stream(cast, torch.tensor([s2]))[0].double()
        row = result[(result["length"] == n) & (result["dtype"] == "bfloat16")].iloc[0]
        assert row["distance"] == pytest.approx(float((y - y2).norm()), rel=1e-12)
        diff = (y - y2).abs()
        step = torch.maximum(y.abs(), y2.abs()) * 2.0**-8  # half a bfloat16 step (mantissa 7 bits) at that scale
        assert bool((diff[diff > 0] >= step[diff > 0]).all())
    fp32 = result[result["dtype"] == "float32"]
    assert (fp32["below_bf16"] == (fp32["relative"] < BF16_HALF_ULP)).all()
    assert model.embed.weight.dtype == torch.float32  # the caller's model is not cast


def test_collapse_over_length_on_a_tiny_model():
    """Theorem 4.2's direction on the tiny model: the pair's float32 distance at the longest length is below the
    shortest's (one more repeat changes less of a longer sequence)."""
    summary = collapse(tiny(), [2, 8, 32], 5, 7, dtypes=("float32",))["summary"].iloc[0]
    assert summary["last_relative"] < summary["first_relative"]


def test_bad_dtype_names_the_choices():
    with pytest.raises(ValueError, match="float32, bfloat16"):
        collapse(tiny(), [4], 5, 7, dtypes=("float16",))
