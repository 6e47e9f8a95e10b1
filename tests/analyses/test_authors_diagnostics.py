"""probe's diagnostics against the statistics their authors' released code computes (tests/fixtures/authors/{massive,
dormant}, written by scripts/authors/{massive,dormant}.py from locuslab/massive-activations and
GuoTianYu2000/Active-Dormant-Attention at pinned commits; docs/definitions.md#massive-activations, #dormant-heads).

Two levels each: the statistic alone (probe's accumulator fed the very tensors the authors' code reduced, fp64, to
1e-12), and end to end (probe's analysis on the same weights through its llama adapter; the project's transformers
is another version than the authors' venv and upcasts its norms to fp32, so agreement there is ~1e-6, not 1e-12).
Where probe's definition departs from theirs on purpose the test pins the exact relation instead of equality."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from probe.analyses.dormant import DormantAccumulator, dormant_heads
from probe.analyses.massive import MassiveAccumulator, massive_activations

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "authors"
LLAMA_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
)


def fixture(name):
    root = FIXTURES / name
    return (
        json.loads((root / "meta.json").read_text()),
        load_file(root / "weights.safetensors"),
        load_file(root / "inputs.safetensors")["input_ids"],
        load_file(root / "outputs.safetensors"),
    )


def llama(meta, weights, dtype):
    """The fixture's transformers Llama (weights under their own names, loaded strictly), wrapped by probe."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from probe.checkpoints.interop import wrap

    hf = LlamaForCausalLM(LlamaConfig(**{k: meta["settings"][k] for k in LLAMA_KEYS}, attn_implementation="eager"))
    hf.load_state_dict(weights, strict=True)
    return wrap(hf.to(dtype).eval())


def as_windows(ids):
    """(N, T) inputs -> probe's (N, 1, T + 1) windows (the last column is a label, never an input)."""
    return torch.cat([ids, ids[:, :1]], 1)[:, None]


def lower_median(a: torch.Tensor) -> torch.Tensor:
    """torch.median's rule: the lower of the two middle values of an even count (per row of a (B, n) tensor)."""
    return a.kthvalue((a.shape[1] + 1) // 2, dim=1).values


# ---------------------------------------------------------------------------------------- massive activations


def test_massive_top_activations_equal_sun_et_al_and_the_median_is_the_documented_departure():
    meta, _, ids, out = fixture("massive")
    feat = out["feat"]  # (N, L, T, d): their layer outputs, the tensors their statistic sorted
    N, L, T, d = feat.shape
    ref = out["mean"]  # (4, L): top1, top2, top3, their median, means over the sequences
    with torch.no_grad():
        from probe.hooks.info import ModelInfo

        info = ModelInfo(
            name="fixture",
            family="llama",
            n_layers=L,
            d_model=d,
            n_heads=4,
            n_kv_heads=2,
            d_head=8,
            n_ctx=T,
            vocab_size=96,
        )
        acc = MassiveAccumulator(info)
        for l in range(L):  # their layer l + 1 is probe's site l + 1 (site 0, the embedding, they do not report)
            acc.add_stream(l + 1, feat[:, l], ids)
    layers = acc.tables()["layers"].set_index("layer").loc[1:L]
    for k, col in enumerate(("top1", "top2", "top3")):
        torch.testing.assert_close(torch.tensor(layers[col].to_numpy()), ref[k], rtol=0, atol=1e-12, msg=col)
    # the median: theirs is torch.median (the lower middle value of T x d = 1024 entries), probe's interpolates
    flat = feat.abs().reshape(N, L, T * d)
    theirs = torch.stack([lower_median(flat[:, l]) for l in range(L)], 1).mean(0)
    torch.testing.assert_close(theirs, ref[3], rtol=0, atol=1e-12)  # their number is the lower order statistic
    interpolated = torch.stack([torch.quantile(flat[:, l], 0.5, dim=1) for l in range(L)], 1).mean(0)
    torch.testing.assert_close(torch.tensor(layers["median"].to_numpy()), interpolated, rtol=0, atol=1e-12)
    assert ((interpolated - ref[3]).abs() > 1e-6).all()  # a real difference (docs/results/agreement.md)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 2e-6), (torch.float32, 1e-5)])
def test_massive_activations_end_to_end_on_their_weights(dtype, tol):
    meta, weights, ids, out = fixture("massive")
    prefix = "" if dtype == torch.float64 else "fp32/"
    res = massive_activations(llama(meta, weights, dtype), as_windows(ids))
    layers = res["layers"].set_index("layer").loc[1:]
    got = torch.tensor(layers[["top1", "top2", "top3"]].to_numpy(float)).T
    torch.testing.assert_close(got, out[prefix + "mean"][:3], rtol=tol, atol=0)


# ---------------------------------------------------------------------------------------------- dormant heads


def test_dormant_key0_mass_is_guo_et_al_bos_attention_without_row_zero():
    """Their bos_attn averages A[t, 0] over every row t = 0..T-1 (row 0 puts all its mass on key 0); probe's
    key0_mass over rows t >= 1. Without a phantom: bos_attn = (1 + (T - 1) key0_mass) / T, exactly."""
    meta, _, ids, out = fixture("dormant")
    A = out["attentions"]  # (N, L, H, T, T) their attention weights
    N, L, H, T, _ = A.shape
    from probe.hooks.info import ModelInfo

    acc = DormantAccumulator(
        ModelInfo(
            name="fixture",
            family="llama",
            n_layers=L,
            d_model=32,
            n_heads=H,
            n_kv_heads=2,
            d_head=8,
            n_ctx=T,
            vocab_size=96,
        )
    )
    for l in range(L):
        acc.add(l, A[:, l, :, :, 0], torch.zeros(N, H, T, dtype=A.dtype), torch.ones(N, T, H, 8, dtype=A.dtype))
    inputs = acc.tables()["inputs"].sort_values(["batch", "row", "layer", "head"])
    key0 = torch.tensor(inputs["key0_mass"].to_numpy()).view(N, L, H)
    torch.testing.assert_close((1 + (T - 1) * key0) / T, out["bos_attn"], rtol=0, atol=1e-12)
    assert (out["bos_attn"] - key0).abs().min() > 1e-3  # the two numbers differ: row 0 is the departure


def test_dormant_heads_end_to_end_on_their_weights():
    meta, weights, ids, out = fixture("dormant")
    res = dormant_heads(llama(meta, weights, torch.float64), as_windows(ids))
    inputs = res["inputs"].sort_values(["batch", "row", "layer", "head"])
    N, L, H = out["bos_attn"].shape
    T = ids.shape[1]
    key0 = torch.tensor(inputs["key0_mass"].to_numpy()).view(N, L, H)
    torch.testing.assert_close((1 + (T - 1) * key0) / T, out["bos_attn"], rtol=2e-6, atol=0)
