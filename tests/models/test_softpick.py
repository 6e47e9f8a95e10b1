"""softpick attention (Zuhri et al. 2025; docs/definitions.md#softpick): the op equals the authors' own function on
their golden outputs (tests/fixtures/softpick, written by make_golden.py from their ``naive_softpick_attn.py``), its
gradients equal autograd through the formula written by hand in fp64, every row's pattern and phantom sum to one, the
model's hook_pattern is the op on its own rot_q / rot_k, a saved model reloads to the same logits
(tests/models/test_pointwise_rules.py, for every row rule), and a config.json without ``attn_fn`` loads as softmax."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from probe.hooks import names
from probe.kernels.sink_attention.reference import attention_scores
from probe.kernels.softpick import softpick_attention, softpick_of_scores
from probe.kernels.softpick.fused import softpick_of_scores_fused
from probe.models import ProbeConfig, create
from tests.support import SMALL

GOLDEN = load_file(str(Path(__file__).resolve().parents[1] / "fixtures" / "softpick" / "golden.safetensors"))
CFG = dict(SMALL, n_kv_heads=2, vocab_size=53)
IDS = torch.randint(0, 53, (2, 11), generator=torch.Generator().manual_seed(0))


def _by_hand(scores: torch.Tensor, eps: float = 1e-8, shifted: bool = True) -> torch.Tensor:
    """The authors' formula written out in fp64, hidden keys (-inf) adding nothing: shifted, relu(e^(x-m) - e^-m) /
    (sum |e^(x-m) - e^-m| + eps) with m the row max, as their code computes it (eps joins the shifted sum); unshifted,
    relu(e^x - 1) / (sum |e^x - 1| + eps), the paper's form (the two agree at eps = 0)."""
    visible = torch.isfinite(scores)
    m = scores.amax(-1, keepdim=True) if shifted else torch.zeros_like(scores[..., :1])
    x = scores.masked_fill(~visible, 0.0)
    e = torch.where(visible, torch.exp(x - m) - torch.exp(-m), torch.zeros_like(scores))
    return torch.relu(e) / (e.abs().sum(-1, keepdim=True) + eps)


def test_the_rule_equals_the_authors_softpick_in_fp64():
    got = softpick_of_scores(GOLDEN["scores"])
    assert (got - GOLDEN["softpick"]).abs().max().item() <= 1e-12


BACKENDS = ("native", "torch", "reference")  # native: the C kernels on CPU


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, tol, which", [(torch.float64, 1e-12, "64"), (torch.float32, 1e-5, "32")])
def test_the_op_equals_the_authors_naive_softpick_attn(dtype, tol, which, backend):
    q, k, v = (GOLDEN[n].to(dtype) for n in ("q", "k", "v"))
    res = softpick_attention(q, k, v, return_pattern=True, backend=backend)
    assert res.out.dtype == dtype and res.pattern.dtype == dtype
    assert (res.pattern.double() - GOLDEN["wei" + which]).abs().max().item() <= tol
    assert (res.out.double() - GOLDEN["out" + which]).abs().max().item() <= tol
    assert (res.phantom + res.pattern.sum(-1) - 1).abs().max().item() <= tol
    assert res.lse is None and res.lse_real is None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("eps, shifted", [(1e-8, True), (0.0, False)])
def test_gradients_equal_autograd_through_the_formula_by_hand(eps, shifted, backend):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 6, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]  # GQA: two query heads per KV head
    w = torch.randn(2, 6, 4, 8, generator=g, dtype=torch.float64)
    grads = []
    for op in ("probe", "by hand"):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        if op == "probe":
            out = softpick_attention(*leaves, eps=eps, backend=backend).out
        else:
            scores = attention_scores(leaves[0], leaves[1])  # B,H,T,T, hidden keys -inf
            a = _by_hand(scores, eps, shifted)
            vf = leaves[2].transpose(1, 2).repeat_interleave(2, dim=1)
            out = (a @ vf).transpose(1, 2)
        grads.append(torch.autograd.grad((out * w).sum(), leaves))
    for mine, theirs in zip(*grads):
        assert (mine - theirs).abs().max().item() <= 1e-12


def test_the_fused_rule_passes_gradcheck():
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(1, 7, 2, 4, generator=g, dtype=torch.float64) * 2 for _ in range(2))
    scores = attention_scores(q, k).requires_grad_(True)
    assert torch.autograd.gradcheck(softpick_of_scores_fused, (scores,))


def test_a_row_that_sees_no_key_or_only_negative_scores_gets_zero_weights():
    scores = torch.tensor([[[[float("-inf"), float("-inf")], [-3.0, -0.5], [-200.0, 500.0]]]], dtype=torch.float32)
    a = softpick_of_scores(scores)
    assert torch.equal(a, softpick_of_scores_fused(scores))
    assert torch.isfinite(a).all()
    assert a[0, 0, 0].sum() == 0 and a[0, 0, 1].sum() == 0
    assert a[0, 0, 2, 1] == pytest.approx(1.0) and a[0, 0, 2, 0] == 0


def test_the_model_pattern_is_the_op_on_its_own_queries_and_keys_and_rows_sum_to_one():
    model = create("softpick", seed=0, **CFG).double()
    assert model.config.attn_fn == "softpick"
    out, cache = model.run_with_cache(IDS)
    logits = out.logits if hasattr(out, "logits") else out
    for l in range(CFG["n_layers"]):
        q, k = cache[names.attn(l, "rot_q")], cache[names.attn(l, "rot_k")]
        pattern, phantom = cache[names.attn(l, "pattern")], cache[names.attn(l, "phantom")]
        expected = softpick_of_scores(attention_scores(q, k))
        assert (pattern - expected).abs().max().item() <= 1e-12
        assert (pattern.sum(-1) + phantom - 1).abs().max().item() <= 1e-12
        assert bool((pattern >= 0).all()) and bool((phantom >= -1e-12).all())
        assert names.attn(l, "lse") not in cache  # softpick has no log-normaliser
    with torch.no_grad():  # the plain forward (no hooks) gives the hooked forward's logits
        plain = model(IDS).logits
    assert (plain - logits).abs().max().item() <= 1e-12


def test_an_edited_pattern_reaches_the_output():
    model = create("softpick", seed=0, **CFG).double()
    with torch.no_grad():
        base = model(IDS).logits
        hooked = model.run_with_hooks(IDS, fwd_hooks=[(names.attn(0, "pattern"), lambda t, hook: t * 0)])
    hooked = hooked.logits if hasattr(hooked, "logits") else hooked
    assert (hooked - base).abs().max().item() > 1e-6


def test_the_model_trains_forward_backward():
    model = create("softpick", seed=0, **CFG)
    logits = model(IDS).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), IDS[:, 1:].reshape(-1))
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_a_config_without_attn_fn_loads_as_softmax(tmp_path):
    saved = ProbeConfig().to_dict()
    del saved["attn_fn"]
    (tmp_path / "config.json").write_text(json.dumps(saved), encoding="utf-8")
    assert ProbeConfig.from_json_file(tmp_path / "config.json").attn_fn == "softmax"
    assert ProbeConfig.from_pretrained(tmp_path).attn_fn == "softmax"
    assert ProbeConfig().attn_fn == "softmax"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(abstention="sinklogit"), "attn_fn='softpick' does not compose with abstention='sinklogit'"),
        (dict(abstention="offbyone"), "attn_fn='softpick' does not compose with abstention='offbyone'"),
        (dict(value_gate="routing-norm"), "attn_fn='softpick' does not compose with value_gate='routing-norm'"),
    ],
)
def test_a_phantom_key_or_routing_gate_is_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError) as err:
        ProbeConfig(attn_fn="softpick", **kwargs)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="attn_fn='nope' is not valid"):
        ProbeConfig(attn_fn="nope")


@pytest.mark.parametrize("variant_settings", [dict(value_gate="norm"), dict(abstention="sinktoken")])
def test_softpick_composes_with_value_slot_gates_and_a_sink_token(variant_settings):
    model = create("baseline", seed=0, attn_fn="softpick", **variant_settings, **CFG)
    assert torch.isfinite(model(IDS).logits).all()


def test_hooked_scores_give_the_pattern_and_an_edit_of_them_reaches_the_output():
    model = create("softpick", seed=0, **CFG).double()
    with torch.no_grad():
        base = model(IDS).logits
        _, cache = model.run_with_cache(IDS, names_filter=lambda n: names.is_attn(n, "attn_scores") or "pattern" in n)
        same = model.run_with_hooks(IDS, fwd_hooks=[(names.attn(1, "attn_scores"), lambda t, hook: t + 0)])
        shifted = model.run_with_hooks(IDS, fwd_hooks=[(names.attn(1, "attn_scores"), lambda t, hook: t - 1)])
    for l in range(CFG["n_layers"]):
        scores, pattern = cache[names.attn(l, "attn_scores")], cache[names.attn(l, "pattern")]
        assert (softpick_of_scores(scores) - pattern).abs().max().item() <= 1e-12
    assert (same - base).abs().max().item() <= 1e-12
    assert (shifted - base).abs().max().item() > 1e-6
