"""Invariants of the custom model family (docs/definitions.md#mechanisms)."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

import probe.models as pm
from probe.models import added_parameters, config_for, create
from probe.train.checkpoint import load_model
from tests.support import SMALL as TINY_TIER_SHRUNK  # noqa: E402

SMALL = dict(TINY_TIER_SHRUNK, n_ctx=32, vocab_size=97)
FIXED = [v for v in pm.VARIANTS if "{" not in v]
ROUTED = ["attnres-full", "attnres-block2", "plr-full-r8", "plr-block2-r8", "slr-full-r8", "slr-block4-r8"]
ALL = FIXED + ROUTED


def tokens(B=2, T=12, V=97, seed=0):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_tiny_baseline_parameter_count_matches_gatedv_small():
    assert sum(p.numel() for p in create("baseline").parameters()) == 2_328_192


def test_unknown_names_raise_with_choices():
    with pytest.raises(ValueError, match="unknown variant 'nope'.*baseline"):
        create("nope")
    with pytest.raises(ValueError, match="unknown tier 'huge'.*tiny"):
        create("baseline", tier="huge")
    with pytest.raises(ValueError, match="depth_blocks=5 must divide"):
        config_for("attnres-block5")


@pytest.mark.parametrize("variant", ALL)
def test_a_variant_sets_its_catalogue_settings_and_leaves_every_other_mechanism_plain(variant):
    """probe.catalogue.VARIANTS is the one variant table: a name's config has its settings there (a routed name adds
    its N and r to its template's) and every other mechanism field at the plain baseline's value."""
    from probe.catalogue import VARIANTS
    from probe.models.variants import _PLAIN

    config = config_for(variant, **SMALL)
    kind, _, rest = variant.partition("-")
    template = (
        variant
        if variant in VARIANTS
        else f"{kind}-{'full' if rest.startswith('full') else 'block{N}'}" + ("-r{r}" if "-r" in rest else "")
    )
    plain = config_for("baseline", **SMALL)
    expected = dict({k: getattr(plain, k) for k in _PLAIN}, **VARIANTS[template].settings)
    if expected["d_value"] == "reduced":
        expected["d_value"] = round(2 * SMALL["d_model"] / 3 / SMALL["n_heads"])
    if expected.get("n_heads") == "paired":  # differential attention: half of SMALL's heads, two branches each
        expected.update(n_heads=2, n_kv_heads=2, d_head=8, d_value=16)
    if template != variant:
        expected["depth_blocks"] = 0 if rest.startswith("full") else int(rest.split("-")[0][len("block") :])
        if "-r" in rest:
            expected["depth_rank"] = int(rest.rpartition("-r")[2])
    assert {k: getattr(config, k) for k in expected} == expected  # a setting outside _PLAIN (pos) too


@pytest.mark.parametrize("variant", ALL)
def test_every_variant_trains_forward_backward_at_tiny_tier(variant):
    overrides = {"depth_rank": 8} if variant.startswith(("plr", "slr")) else {}
    model = create(variant.replace("block2", "block4").replace("-r8", ""), tier="tiny", **overrides)
    ids = torch.randint(0, 8192, (2, 24))
    out = model(ids, labels=ids)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def _expected_hooks(model):
    c = model.config
    B, T = 2, 12
    Tk = T + (c.abstention == "sinktoken")
    H, Hkv, dh, dv, d = c.n_heads, c.n_kv_heads, c.d_head, c.d_value, c.d_model
    shapes = {"hook_embed": (B, Tk, d)}
    for l in range(c.n_layers):
        p = f"blocks.{l}."
        shapes.update(
            {
                p + "hook_resid_pre": (B, Tk, d),
                p + "hook_resid_mid": (B, Tk, d),
                p + "hook_resid_post": (B, Tk, d),
                p + "attn.hook_q": (B, Tk, H, dh),
                p + "attn.hook_k": (B, Tk, Hkv, dh),
                p + "attn.hook_v": (B, Tk, Hkv, dv),
                p + "attn.hook_v_out": (B, Tk, Hkv, dv),
                p + "attn.hook_pattern": (B, H, Tk, Tk),
                p + "attn.hook_pattern_norm": (B, H, Tk, Tk),
                p + "attn.hook_lse": (B, H, Tk),
                p + "attn.hook_z": (B, Tk, H, dv),
                p + "attn.hook_rot_q": (B, Tk, H, dh),
                p + "attn.hook_rot_k": (B, Tk, Hkv, dh),
                p + "attn.hook_attn_scores": (B, H, Tk, Tk),
                p + "attn.hook_result": (B, Tk, H, d),
            }
        )
        if c.attn_fn == "diff":  # two branch queries and keys per head (branch-major), their rows and λ
            for point in ("q", "rot_q"):
                shapes[p + f"attn.hook_{point}"] = (B, Tk, 2 * H, dh)
            for point in ("k", "rot_k"):
                shapes[p + f"attn.hook_{point}"] = (B, Tk, 2 * Hkv, dh)
            shapes[p + "attn.hook_attn_scores"] = (B, 2 * H, Tk, Tk)
            shapes.update({p + f"attn.hook_pattern_{b}": (B, H, Tk, Tk) for b in (1, 2)})
            shapes[p + "attn.hook_lambda"] = (H,)
        if c.qk_norm:
            shapes[p + "attn.hook_q_normed"] = (B, Tk, H, dh)
            shapes[p + "attn.hook_k_normed"] = (B, Tk, Hkv, dh)
        if c.has_phantom:
            shapes[p + "attn.hook_phantom"] = (B, H, Tk)
            shapes[p + "attn.hook_sink_logit"] = (H,)
        if c.value_gate in ("norm", "proj", "routing-norm", "g2"):
            shapes[p + "attn.hook_v_gate"] = (B, Tk, Hkv)
        elif c.value_gate in ("silu", "tanh", "glu"):
            shapes[p + "attn.hook_v_gate"] = (B, Tk, Hkv, dv)
        if c.value_residual != "none" and l > 0:
            shapes[p + "attn.hook_v_first"] = (B, Tk, Hkv, dv)
        if c.dense != "none":
            C = 1 if (l == c.n_layers - 1 or c.dense == "denseformer") else 4
            shapes[p + "dense.hook_weights"] = (B, Tk, C, l + 2)
    if c.hyper != "none":
        n = c.hc_streams
        shapes["hc_head.hook_pre"] = (B, Tk, n)
        for l in range(c.n_layers):
            shapes[f"blocks.{l}.hook_streams"] = (B, Tk, n, d)
            for site in ("attn", "mlp"):
                shapes.update({f"blocks.{l}.hc_{site}.hook_{p}": (B, Tk, n) for p in ("pre", "post")})
                shapes[f"blocks.{l}.hc_{site}.hook_res"] = (B, Tk, n, n)
    if c.depth != "residual":
        from probe.models.depth import site_sources

        r = c.d_model if c.depth == "attnres" else c.depth_rank  # the routing keys' width
        for site, labels in site_sources(c).items():
            shapes[site + ".hook_depth_weights"] = (B, Tk, len(labels))
            shapes[site + ".hook_routing_keys"] = (B, Tk, len(labels), r)
    return shapes


@pytest.mark.parametrize("variant", ALL)
def test_every_hook_fires_with_its_documented_shape(variant):
    model = create(variant, **SMALL)
    ids = tokens()
    _, cache = model.run_with_cache(ids)
    expected = {n: s for n, s in _expected_hooks(model).items() if model.probe_info.lacks(n) is None}
    missing = set(expected) - set(cache)
    assert not missing, f"hooks that did not fire: {sorted(missing)}"
    for name, shape in expected.items():
        assert tuple(cache[name].shape) == shape, name


@pytest.mark.parametrize("variant", ALL)
def test_hooked_path_equals_fast_path_and_pattern_plus_phantom_is_one(variant):
    model = create(variant, **SMALL)
    ids = tokens()
    fast = logits(model, ids)
    out, cache = model.run_with_cache(ids)
    torch.testing.assert_close(out, fast, atol=2e-5, rtol=1e-4)
    for l in range(model.config.n_layers):
        pattern = cache[f"blocks.{l}.attn.hook_pattern"]
        if model.probe_info.lacks(f"blocks.{l}.attn.hook_phantom") is None:  # rows that may sum past one: no phantom
            phantom = cache.get(f"blocks.{l}.attn.hook_phantom", torch.zeros(pattern.shape[:3]))
            torch.testing.assert_close(pattern.sum(-1) + phantom, torch.ones_like(phantom), atol=1e-5, rtol=0)
        assert (pattern.triu(1) == 0).all()  # causal


def test_new_plr_configs_normalise_emitted_keys_and_write_the_definition(tmp_path):
    model = create("plr-block2-r8", **SMALL)
    assert model.config.plr_key == "normalized"
    model.save_pretrained(tmp_path)
    assert '"plr_key": "normalized"' in (tmp_path / "config.json").read_text()
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config.plr_key == "normalized"


def test_a_plr_config_without_the_field_loads_as_the_raw_sum_it_was_trained_with(tmp_path):
    """A config.json written before plr_key (the shipped P-LR block checkpoint's, with the field taken out if it has
    one) loads raw-sum, through from_pretrained and from_json_file alike, and the definition changes its logits."""
    import json
    import shutil

    shutil.copytree("probe/zoo/tiny-plr-block4-r32", tmp_path / "ckpt")
    config_path = tmp_path / "ckpt" / "config.json"
    saved = json.loads(config_path.read_text())
    saved.pop("plr_key", None)
    config_path.write_text(json.dumps(saved))
    old = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    assert old.config.plr_key == "raw" and pm.ProbeConfig.from_json_file(config_path).plr_key == "raw"
    normalized = type(old)(pm.ProbeConfig(**{**old.config.to_dict(), "plr_key": "normalized"}))
    normalized.load_state_dict(old.state_dict())
    ids = tokens(V=old.config.vocab_size)
    assert (logits(old, ids) - logits(normalized, ids)).abs().max() > 1e-3  # the definition matters here


def test_plr_full_is_the_same_function_with_normalised_or_raw_keys():
    """A full-mode key is normalised again at the read, so emission normalisation changes it only through eps."""
    raw = create("plr-full-r8", **SMALL, plr_key="raw", norm_eps=1e-12).double()
    normalized = create("plr-full-r8", **SMALL, norm_eps=1e-12).double()
    for model in (raw, normalized):
        for n, p in model.named_parameters():
            if n.endswith("query"):
                p.data.normal_(generator=torch.Generator().manual_seed(len(n)))
    ids = tokens()
    torch.testing.assert_close(logits(normalized, ids), logits(raw, ids), atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize(
    "field,value", [("plr_key", "summed"), ("depth_block_mean", 1.0), ("depth_block_prior_learned", True)]
)
def test_bad_plr_and_block_option_values_name_the_field(field, value):
    variant = "plr-full-r8" if field != "plr_key" else "plr-block2-r8"
    with pytest.raises(ValueError, match=field):
        config_for(variant, **SMALL, **{field: value})


def test_learned_block_options_are_one_undecayed_scalar_each_and_get_gradients():
    model = create(
        "plr-block2-r8",
        **SMALL,
        depth_block_mean=1.0,
        depth_block_mean_learned=True,
        depth_block_prior=1.0,
        depth_block_prior_learned=True,
    )
    assert model.depth_block_mean.shape == () and model.depth_block_mean.item() == 1.0
    assert {"depth_block_mean", "depth_block_prior"} <= model.no_weight_decay()
    for n, p in model.named_parameters():
        if n.endswith("query"):
            p.data.normal_(generator=torch.Generator().manual_seed(len(n)))
    ids = tokens()
    model(ids, labels=ids).loss.backward()
    assert model.depth_block_mean.grad.abs() > 0 and model.depth_block_prior.grad.abs() > 0
    fixed = create("plr-block2-r8", **SMALL, depth_block_mean=1.0, depth_block_prior=1.0)
    fixed.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("depth_block")})
    torch.testing.assert_close(logits(model, ids), logits(fixed, ids))  # learned at its init = the fixed option


def test_block_prior_is_log_count_on_the_depth_logits():
    model = create("attnres-block2", **SMALL, depth_block_prior=1.0)
    ids = tokens()
    _, cache = model.run_with_cache(ids)
    # zero queries: the weights are softmax(log count) = count / total; the final read sees embed + 2 blocks of 2
    torch.testing.assert_close(cache["final_read.hook_depth_weights"][0, 0], torch.tensor([1 / 5, 2 / 5, 2 / 5]))


def test_slr_with_rank_d_equals_attnres_full_and_block():
    for mode in ("full", "block2"):
        attnres = create(f"attnres-{mode}", **SMALL)
        slr = create(f"slr-{mode}-r32", **SMALL)
        for n, p in attnres.named_parameters():
            if n.endswith("query"):
                p.data.normal_()  # non-trivial routing
        slr.load_state_dict(attnres.state_dict())
        ids = tokens()
        torch.testing.assert_close(logits(slr, ids), logits(attnres, ids), atol=0, rtol=0)


@pytest.mark.parametrize("variant", ["attnres-full", "attnres-block2", "plr-block2-r8", "slr-full-r8"])
def test_zero_queries_give_uniform_mean_of_sources(variant):
    model = create(variant, **SMALL)
    _, cache = model.run_with_cache(tokens())
    for name, w in cache.items():
        if name.endswith("hook_depth_weights"):
            torch.testing.assert_close(w, torch.full_like(w, 1 / w.shape[-1]))
    # site 2 (block 0's MLP read) sees the embedding and block 0's attention output: their mean
    if variant == "attnres-full":
        embed = cache["hook_embed"]
        mid = cache["blocks.0.hook_resid_mid"]
        attn_out = 2 * mid - embed
        torch.testing.assert_close(cache["blocks.0.hook_resid_mid"], (embed + attn_out) / 2)


@pytest.mark.parametrize("variant", ["denseformer", "mudd"])
def test_dense_connections_at_init_equal_the_plain_transformer(variant):
    ids = tokens()
    torch.testing.assert_close(
        logits(create(variant, seed=3, **SMALL), ids),
        logits(create("baseline", seed=3, **SMALL), ids),
        atol=1e-6,
        rtol=1e-5,
    )


def test_sink_logit_minus_infinity_equals_baseline_and_zero_sink_equals_offbyone():
    ids = tokens()
    sink = create("sinklogit", seed=1, **SMALL)
    with torch.no_grad():
        for blk in sink.blocks:
            blk.attn.sink.fill_(-math.inf)
    torch.testing.assert_close(logits(sink, ids), logits(create("baseline", seed=1, **SMALL), ids))
    with torch.no_grad():
        for blk in sink.blocks:
            blk.attn.sink.zero_()
    torch.testing.assert_close(logits(sink, ids), logits(create("offbyone", seed=1, **SMALL), ids))


def test_phantom_changes_the_output_and_sink_logit_gets_a_gradient():
    ids = tokens()
    base, sink = create("baseline", **SMALL), create("sinklogit", **SMALL)
    assert not torch.allclose(logits(base, ids), logits(sink, ids))
    sink(ids, labels=ids).loss.backward()
    assert all(blk.attn.sink.grad.abs().sum() > 0 for blk in sink.blocks)


@pytest.mark.parametrize(
    "variant", ["normgate", "projgate", "sink+norm", "sink+proj", "routing-normgate", "g2", "gatedv"]
)
def test_gates_lie_in_the_unit_interval(variant):
    model = create(variant, **SMALL)
    _, cache = model.run_with_cache(tokens(), names_filter=lambda n: n.endswith("hook_v_gate"))
    assert cache
    for g in cache.values():
        assert ((g > 0) & (g < 1)).all()


def test_norm_gate_formula_and_editing_the_gate_changes_the_output():
    model = create("normgate", **SMALL)
    ids = tokens()
    _, cache = model.run_with_cache(ids)
    v, g = cache["blocks.0.attn.hook_v"], cache["blocks.0.attn.hook_v_gate"]
    tau = model.blocks[0].attn.gate.tau
    expected = torch.sigmoid(8 * (v.norm(dim=-1) / math.sqrt(v.shape[-1]) - tau))
    torch.testing.assert_close(g, expected)
    torch.testing.assert_close(cache["blocks.0.attn.hook_v_out"], g[..., None] * v)
    closed = model.run_with_hooks(ids, fwd_hooks=[("blocks.1.attn.hook_v_gate", lambda t, hook: t * 0)])
    assert not torch.allclose(closed, logits(model, ids))


def test_value_residual_with_lambda_zero_equals_baseline():
    ids = tokens()
    vr = create("value-residual", seed=2, **SMALL)
    with torch.no_grad():
        for blk in vr.blocks[1:]:
            blk.attn.v_mix.zero_()
    torch.testing.assert_close(logits(vr, ids), logits(create("baseline", seed=2, **SMALL), ids))


def test_paired_seeds_share_initial_weights_of_shared_tensors():
    a, b = create("baseline", seed=5, **SMALL).state_dict(), create("sink+proj", seed=5, **SMALL).state_dict()
    c = create("baseline", seed=6, **SMALL).state_dict()
    for name, t in a.items():
        torch.testing.assert_close(b[name], t)
    assert not torch.equal(a["blocks.0.attn.q_proj.weight"], c["blocks.0.attn.q_proj.weight"])


@pytest.mark.parametrize("variant", ["baseline", "sink+proj", "slr-block2-r8", "mudd", "sinktoken"])
def test_save_pretrained_round_trip_through_auto_model(tmp_path, variant):
    model = create(variant, **SMALL)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is pm.ProbeForCausalLM
    ids = tokens()
    torch.testing.assert_close(logits(loaded, ids), logits(model, ids), atol=0, rtol=0)
    _, cache = loaded.run_with_cache(ids)  # still hooked after loading
    assert "blocks.0.attn.hook_pattern" in cache


def test_parameter_formulas():
    L, d, m, H, dh = 6, 128, 384, 4, 32
    r = 16
    assert added_parameters(config_for("slr-full-r16"))["total"] == 2 * L * r
    assert added_parameters(config_for("slr-block4-r16"))["total"] == 2 * L * r
    assert added_parameters(config_for("plr-full-r16"))["total"] == r * (L * (d + m) + d + 2 * L)
    assert added_parameters(config_for("attnres-full"))["total"] == 2 * L * d
    assert added_parameters(config_for("sinklogit"))["total"] == H * L
    assert added_parameters(config_for("normgate"))["total"] == H * L
    assert added_parameters(config_for("projgate"))["total"] == H * (dh + 1) * L
    assert added_parameters(config_for("sink+proj"))["total"] == H * (dh + 2) * L
    assert added_parameters(config_for("sinktoken"))["total"] == d
    assert added_parameters(config_for("gatedv"))["total"] == 0
    assert added_parameters(config_for("value-residual"))["total"] == L - 1
    # the paper's large configuration (LR-AttnRes 2026 A.6): P-LR r=32 adds 2,983,424, S-LR 1,536
    assert added_parameters(config_for("plr-full-r32", tier="lr-attnres"))["total"] == 2_983_424
    assert added_parameters(config_for("slr-full-r32", tier="lr-attnres"))["total"] == 1_536


def test_weight_decay_is_excluded_by_role():
    model = create("sink+proj", **SMALL)
    nd = model.no_weight_decay()
    assert "blocks.0.attn.sink" in nd and "blocks.0.attn.gate.w" in nd  # gate w is 2-D but excluded
    assert "blocks.0.ln1.weight" in nd and "blocks.0.attn.q_proj.weight" not in nd
    mudd = create("mudd", **SMALL).no_weight_decay()
    assert "blocks.0.dense.w1.weight" in mudd and "blocks.0.dense.bias" in mudd
    slr = create("slr-full-r8", **SMALL).no_weight_decay()
    assert "final_read.query" in slr


def test_documented_constant_inits():
    model = create("sink+proj", **SMALL)
    attn = model.blocks[0].attn
    assert (attn.gate.w == 0).all() and (attn.gate.b == 0).all() and (attn.sink == 0).all()
    mudd = create("mudd", **SMALL)
    assert (mudd.blocks[0].dense.w2.weight == 0).all() and mudd.blocks[0].dense.w1.weight.std() > 0
    assert (create("slr-full-r8", **SMALL).final_read.query == 0).all()


@pytest.mark.parametrize("order", ["probe first", "transformers first"])
def test_import_probe_registers_the_model_type_with_auto_classes(tmp_path, order):
    import subprocess
    import sys

    create("baseline", **SMALL).save_pretrained(tmp_path)
    imports = "import probe; import transformers" if order == "probe first" else "import transformers; import probe"
    code = (
        f"{imports}\nm = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})\nprint(type(m).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ProbeForCausalLM")


# ---------------------------------------------------------------- declared roles, gates, runtime backend

# the architectures' own parameters differ too: LayerNorm, learned positions, an untied head, QK-norm, GQA
ARCHS = {
    "rms-rope-tied": SMALL,
    "gpt2-style": dict(
        SMALL, norm="layer", pos="learned", mlp="gelu", init="gpt2", tie_embeddings=False, qk_norm=True, n_kv_heads=2
    ),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant", ALL + ["attnres-block4", "plr-block4-r8", "slr-block2-r16"])
def test_every_parameter_of_every_variant_has_a_declared_role(variant, arch):
    from probe.models.params import ROLES, parameter_roles

    with torch.device("meta"):
        model = create(variant, **ARCHS[arch])
    roles = parameter_roles(model)  # raises on a parameter that no module declares
    assert set(roles) == {n for n, _ in model.named_parameters()} and set(roles.values()) <= set(ROLES)


def test_an_undeclared_parameter_is_an_error_not_a_decayed_matrix():
    model = create("baseline", **SMALL)
    model.blocks[0].attn.extra = torch.nn.Parameter(torch.zeros(3, 3))
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.extra.*param_roles"):
        model.no_weight_decay()


def _attention_io(model, ids, layer=0, edit_gate=None):
    """q, k, v, the gate as the model used it, and z of one layer (optionally editing hook_v_gate)."""
    got = {}
    keep = [
        (f"blocks.{layer}.attn.hook_{n}", lambda t, hook: got.__setitem__(hook.name.rsplit("_", 1)[-1], t))
        for n in ("rot_q", "rot_k", "v", "z")  # the query and key the scores take (after rotary)
    ]

    def gate(g, hook):
        got["gate"] = g if edit_gate is None else edit_gate(g)
        return None if edit_gate is None else got["gate"]

    model.run_with_hooks(ids, fwd_hooks=keep + [(f"blocks.{layer}.attn.hook_v_gate", gate)])
    return got


def test_routing_slot_key_bias_is_logsigmoid_of_the_logit_and_the_log_of_an_edited_gate():
    from probe.kernels import sink_attention

    model = create("routing-normgate", **SMALL)
    with torch.no_grad():
        model.blocks[0].attn.gate.tau.copy_(torch.tensor([0.5, 1.0, 1.5, 2.0]))
    ids = tokens()
    got = _attention_io(model, ids)
    logit = 8 * (got["v"].norm(dim=-1) / math.sqrt(8) - model.blocks[0].attn.gate.tau)  # B,T,Hkv
    torch.testing.assert_close(got["gate"], torch.sigmoid(logit))
    want = sink_attention(
        got["q"], got["k"], got["v"], key_bias=F.logsigmoid(logit).transpose(1, 2), backend="reference"
    ).out
    torch.testing.assert_close(got["z"], want, atol=1e-6, rtol=1e-5)

    def edit(g):  # close every other key; others keep their gate
        g = g.clone()
        g[:, 1::2] = 1e-3
        return g

    edited = _attention_io(model, ids, edit_gate=edit)
    want = sink_attention(
        edited["q"], edited["k"], edited["v"], key_bias=torch.log(edited["gate"]).transpose(1, 2), backend="reference"
    ).out
    torch.testing.assert_close(edited["z"], want, atol=1e-6, rtol=1e-5)
    assert (edited["z"] - got["z"]).abs().max() > 1e-2


def test_routing_slot_fast_and_hooked_paths_agree_where_the_gate_underflows():
    """τ far above every read norm: σ(z) is 0 in fp32 but logsigmoid(z) ≈ z is finite, on both paths."""
    model = create("routing-normgate", **SMALL)
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.gate.tau.fill_(15.0)  # z = 8 (‖v‖/√dh − 15) ≈ −110
    ids = tokens()
    out, cache = model.run_with_cache(ids)
    assert (cache["blocks.0.attn.hook_v_gate"] == 0).all()
    torch.testing.assert_close(out, logits(model, ids), atol=2e-5, rtol=1e-4)


def test_an_edited_pattern_is_what_the_head_aggregates():
    from probe.kernels.sink_attention.reference import apply_pattern

    model = create("sink+proj", **SMALL)
    ids = tokens()
    got = {}
    uniform = torch.tril(torch.ones(12, 12)) / torch.arange(1, 13)[:, None]  # causal uniform rows
    hooks = [
        ("blocks.0.attn.hook_pattern", lambda p, hook: uniform.expand_as(p)),
        ("blocks.0.attn.hook_v_out", lambda t, hook: got.__setitem__("v_out", t)),
        ("blocks.0.attn.hook_z", lambda t, hook: got.__setitem__("z", t)),
    ]
    model.run_with_hooks(ids, fwd_hooks=hooks)
    torch.testing.assert_close(got["z"], apply_pattern(uniform.expand(2, 4, 12, 12), got["v_out"]))
    z0 = {}
    model.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_z", lambda t, hook: z0.__setitem__("z", t))])
    assert (z0["z"] - got["z"]).abs().max() > 1e-3


def test_backend_is_chosen_at_run_time(monkeypatch):
    """An argument (create/load or model.backend) beats use_backend(), which beats $PROBE_BACKEND, which beats auto."""
    from probe.kernels import use_backend
    from probe.kernels.sink_attention import dispatch

    calls = []
    real = dispatch.sink_attention_reference
    monkeypatch.setattr(dispatch, "sink_attention_reference", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.delenv("PROBE_BACKEND", raising=False)
    model, ids = create("sink+norm", **SMALL), tokens()
    fast = logits(model, ids)
    assert calls == []  # auto on CPU: the fused path
    with use_backend("reference"):
        torch.testing.assert_close(logits(model, ids), fast, atol=2e-5, rtol=1e-4)
    assert len(calls) == 2
    monkeypatch.setenv("PROBE_BACKEND", "reference")
    logits(model, ids)
    assert len(calls) == 4
    with use_backend("sdpa"):  # the block beats the environment
        logits(model, ids)
    assert len(calls) == 4
    monkeypatch.setenv("PROBE_BACKEND", "sdpa")
    with use_backend("sdpa"):
        logits(create("sink+norm", backend="reference", **SMALL), ids)  # the model's own setting beats both
    assert len(calls) == 6
    with pytest.raises(ValueError, match="auto.*torch.*reference.*sdpa.*triton"):
        create("baseline", backend="flash", **SMALL)
    monkeypatch.setenv("PROBE_BACKEND", "flash")
    with pytest.raises(ValueError, match="PROBE_BACKEND"):
        logits(model, ids)


def test_a_model_saved_under_triton_loads_and_runs_on_a_cpu(tmp_path):
    """The backend is not saved; an old config.json that records one (every shipped zoo model does) is ignored."""
    import json
    import os
    import subprocess
    import sys

    create("sink+proj", backend="triton", **SMALL).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert "backend" not in cfg
    # as saved before the backend became a runtime choice
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "backend": "triton"}))
    code = f"""
import torch, probe
m = probe.load({str(tmp_path)!r})
assert m.backend is None and "backend" not in m.config.to_dict()
m(torch.arange(12)[None] % 97)
assert probe.load({str(tmp_path)!r}, backend="reference").backend == "reference"
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PROBE_BACKEND")}  # a plain CPU
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


def _as_before_issue_17(state, projection):
    """The state dict with the gate parameters under their old names (``projection``: G2's or GLU's old name)."""
    old = {"gate.tau": "gate_tau", "gate.w": "gate_w", "gate.b": "gate_b", "gate.proj.weight": projection}
    return {
        (n.rsplit(".attn.", 1)[0] + ".attn." + old[n.rsplit(".attn.", 1)[1]] if ".attn.gate." in n else n): t
        for n, t in state.items()
    }


@pytest.mark.parametrize(
    "variant,old",
    [
        ("sink+proj", "gate_w"),
        ("routing-normgate", "gate_tau"),
        ("g2", "g2_proj.weight"),
        ("glu-full", "v_gate_proj.weight"),
    ],
)
def test_checkpoints_with_the_old_gate_parameter_names_load_and_resave_under_the_new(tmp_path, variant, old):
    from safetensors.torch import load_file, save_file

    model = create(variant, **SMALL)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".attn.gate." in n:
                p.normal_()
    state = _as_before_issue_17({n: t.contiguous() for n, t in model.state_dict().items()}, old)
    # as before the gates became modules
    assert f"blocks.1.attn.{old}" in state and not any(".attn.gate." in n for n in state)
    model.config.save_pretrained(tmp_path)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ids = tokens()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    torch.testing.assert_close(logits(loaded, ids), logits(model, ids), atol=0, rtol=0)
    fresh = create(variant, seed=9, **SMALL)
    with pytest.raises(RuntimeError, match=rf"blocks\.1\.attn\.{re.escape(old)}"):
        fresh.load_state_dict(state)  # the model knows today's names only: plain torch loading refuses the old ones
    load_model(fresh, tmp_path)  # the trainer's resume reads them, as from_pretrained does
    torch.testing.assert_close(logits(fresh, ids), logits(model, ids), atol=0, rtol=0)
    loaded.save_pretrained(tmp_path / "again")
    assert set(load_file(str(tmp_path / "again" / "model.safetensors"))) == set(model.state_dict())
