"""Differential attention (DIFF V1, Ye et al. 2024; docs/definitions.md#differential-attention): the op and the
attention module equal the authors' ``MultiheadDiffAttn`` on their golden outputs (tests/fixtures/diff, written by
make_golden.py from their ``multihead_diffattn.py``), the fused path equals the reference on outputs and gradients,
the model's hook_pattern is p1 - λ p2 of its own branch queries and keys, and edits of λ, a branch or the net rows
reach the output."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from probe.hooks import names
from probe.kernels.diff_attention import BACKENDS, diff_attention, dispatch, lambda_init
from probe.kernels.diff_attention.blocks import diff_attention_blocks
from probe.kernels.sink_attention.reference import attention_scores
from probe.models import ProbeConfig, create
from probe.models.attention import Attention
from tests.support import SMALL

GOLDEN = load_file(str(Path(__file__).resolve().parents[1] / "fixtures" / "diff" / "golden.safetensors"))
H, DH, DEPTH = 2, 4, 3  # the golden module: embed_dim 16, num_heads 2 (head_dim 4), MHA, depth 3
CFG = {k: v for k, v in dict(SMALL, vocab_size=53).items() if k != "n_heads"}  # the variant halves the tier's 4
IDS = torch.randint(0, 53, (2, 11), generator=torch.Generator().manual_seed(0))
TOLS = [(torch.float64, 1e-12, "64"), (torch.float32, 1e-5, "32")]


def _authors_lambda(dtype) -> torch.Tensor:
    one = torch.exp((GOLDEN["lambda_q1"] * GOLDEN["lambda_k1"]).sum())
    two = torch.exp((GOLDEN["lambda_q2"] * GOLDEN["lambda_k2"]).sum())
    return (one - two + lambda_init(DEPTH)).expand(H).to(dtype)


def _branch_major(x: torch.Tensor) -> torch.Tensor:
    """The authors' (B,T,2N,dh), head n's branches at 2n, 2n+1 -> the op's branch-major (B,T,2N,dh), written here."""
    return torch.cat([x[:, :, 0::2], x[:, :, 1::2]], dim=2)


def test_lambda_init_is_the_papers_formula_of_the_one_based_layer():
    for layer in range(6):
        l_paper = layer + 1  # the paper's l in [1, L]
        assert lambda_init(layer) == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * (l_paper - 1)), abs=1e-15)
    assert lambda_init(0) == pytest.approx(0.2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, tol, which", TOLS)
def test_the_op_equals_the_authors_attention_before_the_norm(dtype, tol, which, backend):
    x = GOLDEN["x"].to(dtype)
    B, T, _ = x.shape
    q = _branch_major((x @ GOLDEN["q_proj"].to(dtype).T).view(B, T, 2 * H, DH))
    k = _branch_major((x @ GOLDEN["k_proj"].to(dtype).T).view(B, T, 2 * H, DH))
    v = (x @ GOLDEN["v_proj"].to(dtype).T).view(B, T, H, 2 * DH)
    res = diff_attention(q, k, v, _authors_lambda(dtype), backend=backend)
    assert res.out.dtype == dtype
    assert (res.out.transpose(1, 2).double() - GOLDEN["diff" + which]).abs().max().item() <= tol


def _golden_attention(dtype) -> Attention:
    config = ProbeConfig(d_model=16, n_heads=H, d_head=DH, d_value=2 * DH, attn_fn="diff", pos="none")
    attn = Attention(config, layer=DEPTH).to(dtype)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(attn, name).weight.copy_(GOLDEN[name])
        attn.o_proj.weight.copy_(GOLDEN["out_proj"])
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(attn.diff, name).copy_(GOLDEN[name])
        attn.diff.subln.weight.copy_(GOLDEN["subln"])
    return attn


@pytest.mark.parametrize("dtype, tol, which", TOLS)
def test_the_attention_module_equals_the_authors_module(dtype, tol, which):
    attn = _golden_attention(dtype)
    seen = {}
    attn.hook_z.add_hook(lambda t, hook: seen.setdefault("z", t))
    with torch.no_grad():
        out, _, _ = attn(GOLDEN["x"].to(dtype))
    B, T = out.shape[:2]
    assert (seen["z"].reshape(B, T, -1).double() - GOLDEN["z" + which]).abs().max().item() <= tol
    assert (out.double() - GOLDEN["out" + which]).abs().max().item() <= tol


def test_the_attention_module_gradients_equal_those_of_the_reference_path():
    """The fused path (no hooks) and the materialised one (hooked pattern) give the same input and weight gradients."""
    grads = []
    for hooked in (False, True):
        attn = _golden_attention(torch.float64)
        if hooked:
            attn.hook_pattern.add_hook(lambda t, hook: t)
        x = GOLDEN["x"].clone().requires_grad_(True)
        out, _, _ = attn(x)
        params = [
            x,
            attn.q_proj.weight,
            attn.k_proj.weight,
            attn.v_proj.weight,
            attn.diff.lambda_q1,
            attn.diff.lambda_k2,
        ]
        grads.append(torch.autograd.grad((out * out.detach().sin()).sum(), params))
    for fused, reference in zip(*grads):
        assert (fused - reference).abs().max().item() <= 1e-12


@pytest.mark.parametrize("Hkv", [1, 2, 4])
def test_the_fused_op_equals_the_reference_on_outputs_and_gradients(Hkv):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 9, 8, 4, generator=g, dtype=torch.float64)  # H = 4 heads, two branches each
    k = torch.randn(2, 9, 2 * Hkv, 4, generator=g, dtype=torch.float64)
    v = torch.randn(2, 9, Hkv, 6, generator=g, dtype=torch.float64)
    lam = torch.tensor([0.2, 0.5, 0.9, -0.1], dtype=torch.float64)
    w = torch.randn(2, 9, 4, 6, generator=g, dtype=torch.float64)
    results = {}
    for backend in BACKENDS:
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v, lam)]
        out = diff_attention(*leaves, backend=backend).out
        results[backend] = (out, *torch.autograd.grad((out * w).sum(), leaves))
    for backend in ("torch", "blocks", "sdpa"):
        for fused, reference in zip(results[backend], results["reference"]):
            assert (fused - reference).abs().max().item() <= 1e-12


@pytest.mark.parametrize("Hkv, Tq, block", [(2, 19, 4), (1, 19, 5), (2, 7, 3), (4, 1, 64)])
def test_the_blocks_equal_the_reference_across_block_edges_and_a_cache(Hkv, Tq, block):
    """Query blocks of ``block`` over 19 keys, the queries the last Tq of them (a cache where Tq < 19), GQA: outputs
    and the gradients of q, k, v and λ in fp64 within 1e-12 of the reference's; fp32 within 1e-5, in fp32."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, Tq, 8, 4, generator=g, dtype=torch.float64)
    k = torch.randn(2, 19, 2 * Hkv, 4, generator=g, dtype=torch.float64)
    v = torch.randn(2, 19, Hkv, 6, generator=g, dtype=torch.float64)
    lam = torch.tensor([0.2, 0.5, 0.9, -0.1], dtype=torch.float64)
    w = torch.randn(2, Tq, 4, 6, generator=g, dtype=torch.float64)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        results = []
        for blocks in (True, False):
            leaves = [t.to(dtype).requires_grad_(True) for t in (q, k, v, lam)]
            if blocks:
                out = diff_attention_blocks(*leaves, block=block)
            else:
                out = diff_attention(*leaves, backend="reference").out
            results.append((out, *torch.autograd.grad((out * w.to(dtype)).sum(), leaves)))
        for got, want in zip(*results):
            assert got.dtype == dtype
            assert (got - want).abs().max().item() <= tol


def test_torch_trains_in_blocks_on_the_cpu_and_runs_the_flash_path_without_a_gradient(monkeypatch):
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return diff_attention_blocks(*args, **kwargs)

    monkeypatch.setattr(dispatch, "diff_attention_blocks", counted)
    q, k, v = torch.randn(1, 5, 4, 2), torch.randn(1, 5, 4, 2), torch.randn(1, 5, 2, 4)
    lam = torch.full((2,), 0.3, requires_grad=True)
    diff_attention(q, k, v, lam)
    assert calls == [1]
    with torch.no_grad():
        diff_attention(q, k, v, lam)
    diff_attention(q, k, v, lam.detach())
    monkeypatch.setattr(dispatch, "SAVED_BYTES", 3 * 2 * 5 * 5 * 4 - 1)  # one float short of the rows it would keep
    diff_attention(q, k, v, lam)
    assert calls == [1]


def test_the_op_refuses_edits_and_bad_shapes_in_one_line():
    q, k, v = torch.randn(1, 3, 4, 2), torch.randn(1, 3, 2, 2), torch.randn(1, 3, 1, 2)
    for kwargs, message in (
        (dict(edit=object()), "attention edits (knockout, eviction) are not supported under differential"),
        (dict(backend="triton"), "backend='triton' is not valid for differential attention"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)) as e:
            diff_attention(q, k, v, torch.zeros(2), **kwargs)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"λ \(2,\)"):
        diff_attention(q, k, v, torch.zeros(3))


def test_the_model_pattern_is_p1_minus_lambda_p2_of_its_own_branches():
    model = create("diff", seed=0, **CFG).double()
    c = model.config
    assert (c.attn_fn, c.n_heads, c.n_kv_heads, c.d_head, c.d_value) == ("diff", 2, 2, 8, 16)
    out, cache = model.run_with_cache(IDS)
    for l in range(c.n_layers):
        q, k = cache[names.attn(l, "rot_q")], cache[names.attn(l, "rot_k")]  # B,T,2H,dh / B,T,2Hkv,dh branch-major
        p1, p2 = cache[names.attn(l, "pattern_1")], cache[names.attn(l, "pattern_2")]
        lam, net = cache[names.attn(l, "lambda")], cache[names.attn(l, "pattern")]
        both = torch.softmax(attention_scores(q, k), -1)  # B,2H,T,T, written out: the two branches' softmax
        assert (p1 - both[:, :2]).abs().max().item() <= 1e-12 and (p2 - both[:, 2:]).abs().max().item() <= 1e-12
        assert (net - (p1 - lam[:, None, None] * p2)).abs().max().item() <= 1e-12
        assert (net.sum(-1) - (1 - lam[:, None])).abs().max().item() <= 1e-12  # signed rows summing to 1 - λ
        lam_by_hand = sum(
            s
            * torch.exp(
                (
                    model.get_parameter(f"blocks.{l}.attn.diff.lambda_q{i}").double()
                    * model.get_parameter(f"blocks.{l}.attn.diff.lambda_k{i}").double()
                ).sum()
            )
            for i, s in ((1, 1), (2, -1))
        ) + lambda_init(l)
        assert (lam - lam_by_hand).abs().max().item() <= 1e-12
        for absent in ("lse", "phantom", "pattern_norm"):
            assert names.attn(l, absent) not in cache
    with torch.no_grad():
        plain = model(IDS).logits
    assert (plain - (out.logits if hasattr(out, "logits") else out)).abs().max().item() <= 1e-12


@pytest.mark.parametrize(
    "point, edit",
    [("lambda", lambda t, hook: t * 0), ("pattern_2", lambda t, hook: t * 0), ("pattern", lambda t, hook: t.flip(-1))],
)
def test_an_edit_of_lambda_a_branch_or_the_net_rows_reaches_the_output(point, edit):
    model = create("diff", seed=0, **CFG).double()
    with torch.no_grad():
        base = model(IDS).logits
        same = model.run_with_hooks(IDS, fwd_hooks=[(names.attn(0, point), lambda t, hook: t + 0)])
        edited = model.run_with_hooks(IDS, fwd_hooks=[(names.attn(0, point), edit)])
    assert (same - base).abs().max().item() <= 1e-12
    assert (edited - base).abs().max().item() > 1e-6


def test_lambda_zero_makes_the_net_row_branch_one():
    model = create("diff", seed=0, **CFG).double()
    with torch.no_grad(), model.hooks(fwd_hooks=[(names.attn(1, "lambda"), lambda t, hook: t * 0)]):
        _, cache = model.run_with_cache(IDS)
    assert torch.equal(cache[names.attn(1, "pattern")], cache[names.attn(1, "pattern_1")])


def test_the_model_trains_and_reloads(tmp_path):
    model = create("diff", seed=0, **CFG)
    logits = model(IDS).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), IDS[:, 1:].reshape(-1))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    lam = model.get_parameter("blocks.0.attn.diff.lambda_q1")
    assert 0.02 < lam.std().item() < 0.3  # drawn N(0, 0.1²) as the authors', not the fan-in scale or zeros
    model.save_pretrained(tmp_path)
    again = type(model).from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(again(IDS).logits, model(IDS).logits)


def test_odd_heads_are_refused_in_one_line():
    assert create("diff", seed=0, **dict(CFG, n_heads=1)).config.d_head == 16  # one head: two branches of d/2
    with pytest.raises(ValueError, match="differential attention pairs heads: n_heads=3") as e:
        create("diff", seed=0, **dict(CFG, n_heads=3))
    assert "\n" not in str(e.value)


def test_signed_row_masses_equal_the_hooked_patterns_by_hand():
    """Streaming (blocks of 4 query rows) against hook_pattern / _1 / _2: net Σa = 1 - λ, Σ|a|, |a| on key 0 and
    every key, each branch's softmax mass on them (docs/definitions.md#signed-rows)."""
    from probe.kernels.row_masses.signed import signed_row_masses

    model = create("diff", seed=0, **CFG).double()
    _, cache = model.run_with_cache(IDS)
    for l in range(2):
        q, k = cache[names.attn(l, "rot_q")], cache[names.attn(l, "rot_k")]
        B, T, Hkv2, _ = k.shape
        ind = torch.zeros(B, T, Hkv2 // 2, 2, dtype=torch.float64)
        ind[:, 0, :, 0], ind[..., 1] = 1.0, 1.0  # key 0, every key
        got = signed_row_masses(q, k, ind, cache[names.attn(l, "lambda")], block=4)
        a = cache[names.attn(l, "pattern")]
        by_hand = {
            "net": a.sum(-1),
            "absolute": a.abs().sum(-1),
            "masses": torch.stack([a[..., 0].abs(), a.abs().sum(-1)], -1),
            "branch_1": torch.stack([cache[names.attn(l, "pattern_1")][..., 0], torch.ones_like(a[..., 0])], -1),
            "branch_2": torch.stack([cache[names.attn(l, "pattern_2")][..., 0], torch.ones_like(a[..., 0])], -1),
        }
        for field, want in by_hand.items():
            assert (getattr(got, field) - want).abs().max().item() <= 1e-12, field


def test_knockout_and_eviction_refuse_a_diff_model_in_one_line():
    from probe.analyses.interventions.base import AblationError
    from probe.analyses.interventions.evict import Eviction
    from probe.analyses.interventions.knockout import Knockout

    model = create("diff", seed=0, **CFG)
    for kind, what in ((Knockout, "key-0 knockout"), (Eviction, "window eviction")):
        with pytest.raises(AblationError, match=f"has diff attention rows, which take no {what}") as e:
            kind.conditions(model, None, None)
        assert "\n" not in str(e.value)


def test_the_attention_module_equals_hf_diffllama_up_to_its_head_layout():
    """HF's DiffLlamaAttention (SDPA, fp64, rotary the identity) with its weights moved to probe's layout: its
    branches are the first and second half of the query and KV heads, its value the two KV halves side by side, its
    norm without a gain (probe's gain left at ones, eps set equal)."""
    from transformers import DiffLlamaConfig
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention

    hf_cfg = DiffLlamaConfig(
        hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4, rms_norm_eps=1e-5
    )
    hf_cfg._attn_implementation = "sdpa"  # eager takes the softmax in fp32 whatever the dtype; SDPA keeps fp64
    torch.manual_seed(0)
    theirs = DiffLlamaAttention(hf_cfg, layer_idx=2).double()
    ours = Attention(
        ProbeConfig(d_model=16, n_heads=2, n_kv_heads=1, d_head=4, d_value=8, attn_fn="diff", pos="none"), 2
    )
    ours = ours.double()
    q, k = theirs.q_proj.weight.view(2, 2, 4, 16), theirs.k_proj.weight.view(2, 1, 4, 16)  # (branch, head, dh, d)
    with torch.no_grad():
        ours.q_proj.weight.copy_(q.transpose(0, 1).reshape(16, 16))  # head h's branches at rows 2h, 2h + 1
        ours.k_proj.weight.copy_(k.transpose(0, 1).reshape(8, 16))
        ours.v_proj.weight.copy_(theirs.v_proj.weight)  # one value head: KV halves 0 and 1 side by side
        ours.o_proj.weight.copy_(theirs.o_proj.weight)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(ours.diff, name).copy_(getattr(theirs, name))
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    ones, zeros = torch.ones(2, 7, 4, dtype=torch.float64), torch.zeros(2, 7, 4, dtype=torch.float64)
    causal = torch.full((7, 7), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        want, _ = theirs(x, position_embeddings=(ones, zeros), attention_mask=causal)
        got, _, _ = ours(x)
        assert (got - want).abs().max().item() <= 1e-6  # HF takes λ's exponent in fp32 whatever the dtype
        for module in (theirs, ours.diff):  # λ = λ_init exactly in both: the rest agrees to fp64 rounding
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                getattr(module, name).zero_()
        want, _ = theirs(x, position_embeddings=(ones, zeros), attention_mask=causal)
        got, _, _ = ours(x)
    assert (got - want).abs().max().item() <= 1e-12
