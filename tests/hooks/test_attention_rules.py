"""One description of each layer's attention (ModelInfo.attention_at -> LayerAttention): its fields are what the HF
config states (Gemma 2's soft-cap and scale, Llama 4's chunks, BLOOM's ALiBi slopes, Mistral's window) or what a
probe model declares (a phantom, a routing gate, FoX's forget gate, softpick rows), and the streaming row masses
built from it alone equal the pattern the model's attention computed, key by key."""

from __future__ import annotations

import pytest
import torch

from probe.analyses.capture import row_mass_hooks, row_masses
from probe.checkpoints.adapters import adapt
from probe.checkpoints.tiny import tiny_model
from probe.hooks import LayerAttention, ModelInfo, names
from tests.support.analyses import tiny

T = 12  # longer than the tiny configs' window (4) and chunk (4): sliding and chunked layers really cut keys
HF_FAMILIES = ("gemma2", "llama4_text", "bloom", "mistral", "gpt_neo")
PROBE_VARIANTS = ("sinklogit", "routing-normgate", "fox")


@pytest.fixture(scope="module")
def hf_models():
    return {mt: adapt(tiny_model(mt)) for mt in HF_FAMILIES}


def kind_of(config_type: str) -> str:
    return "sliding" if "sliding" in config_type else "chunked" if "chunk" in config_type else "full"


def attention_module(m, layer: int):
    return m.attention_module(m.decoder_layers(m.hf_model)[layer])


def test_gemma2_states_its_soft_cap_scale_and_windows(hf_models):
    m = hf_models["gemma2"]
    cfg = m.hf_model.config
    for l, kind in enumerate(cfg.layer_types):
        rules = m.probe_info.attention_at(l)
        assert (rules.rule, rules.mask, rules.softcap) == ("softmax", kind_of(kind), cfg.attn_logit_softcapping)
        assert rules.window == (cfg.sliding_window if kind_of(kind) == "sliding" else None) and rules.chunk is None
        assert rules.scale == pytest.approx(cfg.query_pre_attn_scalar**-0.5, rel=1e-12)
        assert rules.scale == pytest.approx(attention_module(m, l).scaling, rel=1e-12)
        assert not rules.phantom and rules.alibi_slopes is None


def test_llama4_states_its_chunks(hf_models):
    m = hf_models["llama4_text"]
    cfg = m.hf_model.config
    assert "chunked" in [kind_of(k) for k in cfg.layer_types]
    for l, kind in enumerate(cfg.layer_types):
        rules = m.probe_info.attention_at(l)
        assert rules.mask == kind_of(kind) and rules.window is None
        assert rules.chunk == (cfg.attention_chunk_size if rules.mask == "chunked" else None)
        assert rules.scale == pytest.approx(attention_module(m, l).scaling, rel=1e-12)


def test_bloom_states_its_alibi_slopes(hf_models):
    """BLOOM's slopes for H a power of two are 2^(-8(h+1)/H) (Press et al. 2022), the bias slope_h · key position."""
    m = hf_models["bloom"]
    H = m.hf_model.config.n_head
    for l in range(m.probe_info.n_layers):
        rules = m.probe_info.attention_at(l)
        assert rules.alibi_slopes == pytest.approx([2 ** (-8 * (h + 1) / H) for h in range(H)], rel=1e-6)
        bias = rules.alibi_bias(2, 5)  # (B, H, T)
        assert bias.shape == (2, H, 5) and torch.equal(bias[1, 2], rules.alibi_slopes[2] * torch.arange(5.0))


def test_sliding_families_state_their_window(hf_models):
    for mt, layer_kinds in (("mistral", None), ("gpt_neo", "attention_layers")):
        m = hf_models[mt]
        cfg = m.hf_model.config
        window = cfg.window_size if mt == "gpt_neo" else cfg.sliding_window
        kinds = getattr(cfg, layer_kinds) if layer_kinds else ["sliding"] * cfg.num_hidden_layers
        for l, kind in enumerate(kinds):
            rules = m.probe_info.attention_at(l)
            sliding = kind in ("sliding", "local")
            assert (rules.mask, rules.window) == (("sliding", window) if sliding else ("full", None))


@pytest.mark.parametrize("variant", PROBE_VARIANTS + ("softpick",))
def test_a_probe_model_states_what_its_mechanisms_declare(variant):
    m = tiny(variant)
    c, info = m.config, m.probe_info
    for l in range(info.n_layers):
        rules = info.attention_at(l)
        assert (rules.rule, rules.phantom, rules.mask) == (c.attn_fn, c.has_phantom, "full")
        assert rules.gate_on_logits == (variant == "routing-normgate")
        assert rules.forget_gate == (variant == "fox")
        assert rules.scale == c.d_head**-0.5 and rules.softcap is None and rules.alibi_slopes is None


def one_hot_keys(B: int, T: int, Hkv: int) -> torch.Tensor:
    """(B, T, Hkv, T) indicators: column c marks key c alone, so the row masses are the whole pattern."""
    return torch.eye(T)[None, :, None, :].expand(B, T, Hkv, T).contiguous()


@torch.no_grad()
def check_row_masses_are_the_pattern(m, x, backend) -> None:
    info = m.probe_info
    _, cache = m.run_with_cache(x)
    points = row_mass_hooks(info)
    for l in info.attention_layers:
        got = {p: cache[names.attn(l, p.removeprefix("hook_"))] for p in points}
        _, mass, phantom = row_masses(info, l, got, one_hot_keys(x.shape[0], T, info.n_kv_heads), backend=backend)
        pattern = cache[names.attn(l, "pattern")].float()  # (B, H, T, T)
        torch.testing.assert_close(mass, pattern, atol=2e-6, rtol=0)
        torch.testing.assert_close(phantom, cache[names.attn(l, "phantom")].float(), atol=2e-6, rtol=0)


@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("mt", HF_FAMILIES)
def test_hf_row_masses_from_the_description_are_the_pattern(hf_models, mt, backend):
    m = hf_models[mt]
    x = torch.randint(2, m.probe_info.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    check_row_masses_are_the_pattern(m, x, backend)


@pytest.mark.parametrize("variant", PROBE_VARIANTS)
def test_probe_row_masses_from_the_description_are_the_pattern(variant):
    m = tiny(variant)
    x = torch.randint(0, m.probe_info.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    check_row_masses_are_the_pattern(m, x, "torch")


def test_chunked_layers_cut_keys_at_each_chunk_start(hf_models):
    """The chunk is not a no-op here: rows of the second chunk put nothing on the first chunk's keys."""
    m = hf_models["llama4_text"]
    layer = next(l for l in m.probe_info.attention_layers if m.probe_info.attention_at(l).mask == "chunked")
    chunk = m.probe_info.attention_at(layer).chunk
    _, cache = m.run_with_cache(torch.arange(2, 2 + T)[None])
    pattern = cache[names.attn(layer, "pattern")]
    assert chunk < T and float(pattern[..., chunk:, :chunk].abs().max()) == 0.0
    assert float(pattern[..., chunk - 1, :chunk].sum(-1).min()) == pytest.approx(1.0, abs=1e-5)


def test_saved_infos_keep_their_extra_keys():
    """A ModelInfo written before the description (its rules only in fields and ``extra``) reads the same."""
    info = ModelInfo(
        name="saved",
        family="llama4",
        n_layers=3,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        d_head=8,
        n_ctx=64,
        vocab_size=96,
        layer_types=["chunked", "sliding", "full"],
        sliding_window=6,
        extra={"attn_chunk": 5, "attn_scale": [0.5, 0.25, 0.125], "attn_logit_softcap": 0},
    )
    got = [(r.mask, r.window, r.chunk, r.scale, r.softcap) for r in map(info.attention_at, range(3))]
    assert got == [("chunked", None, 5, 0.5, None), ("sliding", 6, None, 0.25, None), ("full", None, None, 0.125, None)]
    assert info.scale_of(1) == 0.25 and info.alibi_bias(1, 4) is None


@pytest.mark.parametrize(
    "fields, visible",
    [
        (dict(mask="full"), [1, 2, 3, 4, 5, 6, 7]),
        (dict(mask="sliding", window=3), [1, 2, 3, 3, 3, 3, 3]),
        (dict(mask="sliding"), [1, 2, 3, 4, 5, 6, 7]),  # no window stated: every causal key
        (dict(mask="chunked", chunk=3), [1, 2, 3, 1, 2, 3, 1]),
    ],
)
def test_visible_keys_and_the_rows_that_see_key_0_follow_the_mask(fields, visible):
    """By hand: the keys row t sees are those of the mask's definition (j <= t, within the window, within t's chunk);
    a row sees key 0 exactly when key 0 is among them, and those rows lead."""
    rules = LayerAttention(rule="softmax", scale=1.0, **fields)
    T, window, chunk = 7, fields.get("window") or 7, fields.get("chunk") or 7
    seen = [[j for j in range(t + 1) if t - j < window and j // chunk == t // chunk] for t in range(T)]
    assert [len(keys) for keys in seen] == visible
    assert rules.visible_keys(T).tolist() == visible and rules.visible_keys(T).dtype == torch.float64
    sees0 = [0 in keys for keys in seen]
    assert rules.sees_key0(T).tolist() == sees0 and sees0 == sorted(sees0, reverse=True)


@pytest.mark.parametrize("topk", [None, 2])
def test_compressed_entries_join_the_visible_keys_but_not_key_0(topk):
    """By hand (window 3, rate 4, 13 tokens): entry w covers tokens 4w .. 4w+3 and row t sees it once t >= 4w + 3, at
    most top-k of them; the visible keys add those entries to the window's tokens, and key 0 (token column 0) is seen
    by rows t < 3 only, whatever entry summarises it."""
    rules = LayerAttention(rule="softmax", mask="sliding", window=3, scale=1.0, compress_rate=4, compress_topk=topk)
    T = 13
    closed = [sum(1 for w in range(T) if 4 * w + 3 <= t) for t in range(T)]
    entries = [c if topk is None else min(c, topk) for c in closed]
    assert rules.compressed_entries(T) == 3 and rules.visible_entries(T).tolist() == entries
    assert rules.visible_keys(T).tolist() == [min(t + 1, 3) + e for t, e in enumerate(entries)]
    assert rules.sees_key0(T).tolist() == [t < 3 for t in range(T)]


def test_a_linear_layer_has_no_visible_keys():
    with pytest.raises(ValueError, match="a linear layer has no attention rows"):
        LayerAttention(rule="softmax", mask="linear", scale=1.0).sees_key0(4)


@pytest.mark.parametrize(
    "fields, says",
    [
        (dict(rule="relu"), "attention rule 'relu' is not one of softmax, softpick"),
        (dict(mask="local"), "attention mask 'local' is not one of full, sliding, chunked, linear"),
        (dict(window=4), "a window of 4 needs a sliding layer"),
        (dict(mask="chunked", chunk=0), "a chunk of 0 needs a chunked layer and at least 1 key"),
        (dict(softcap=-1.0), "soft-cap -1.0 must be positive"),
        (dict(compress_rate=0), "a compress rate of 0 must be at least 1"),
        (dict(compress_topk=2), "a compressed top-k needs a compress rate"),
    ],
)
def test_a_bad_description_is_refused_in_one_line(fields, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(".", r"\.")) as e:
        LayerAttention(**{"rule": "softmax", "mask": "full", "scale": 0.5, **fields})
    assert "\n" not in str(e.value)


def test_an_attention_other_than_the_described_one_is_refused():
    """Each call checks what the module ran against ``attention_at``: a described soft-cap other than the module's
    is refused in one line, on Gemma 2's soft-capped path."""
    m = adapt(tiny_model("gemma2"))
    m.probe_info.extra["attn_logit_softcap"] = 3.0  # the storage the description reads; the module caps at 2.0
    assert m.probe_info.attention_at(0).softcap == 3.0
    with pytest.raises(
        ValueError, match="layer 0 ran its attention with softcap 2.0, but the adapter describes it with 3.0"
    ) as e:
        m(torch.arange(2, 2 + T)[None])
    assert "\n" not in str(e.value)


def test_the_rules_named_are_softmax_and_the_kernels_row_rules():
    from probe.hooks.attention_rules import RULES
    from probe.kernels.diff_attention import SIGNED_RULES
    from probe.kernels.row_rules import ROW_RULES

    assert set(RULES) == {"softmax", *ROW_RULES, *SIGNED_RULES}
