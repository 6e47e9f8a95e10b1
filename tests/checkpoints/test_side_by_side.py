"""probe's hook names side by side with TransformerLens's TransformerBridge and nnsight, on a tiny saved folder of one
model_type per adapter family the bridge maps: every name both expose holds the same tensor (fp32, ≤ 1e-5), except
the disagreements below, each a genuine difference of meaning (or a defect on the other side) with its reason;
nnsight's module outputs equal probe's names; the counts are reported, on docs/reference/hook-names.md too (the page
benchmarks/hook_names.py writes). The names and values come from tests/support/side_by_side.py."""

from __future__ import annotations

import pytest
import torch

from probe.checkpoints.tiny import build_tiny
from tests.support import side_by_side as sbs

ATOL = 1e-5
pytestmark = pytest.mark.filterwarnings("ignore")

# (model_type or "*", name: a per-layer template or one layer's name) -> why the two sides differ there. Only genuine
# differences of meaning or layout, or a defect of the bridge shown by a third reading (nnsight, or the bridge's own
# source); a probe bug is never listed. Read from transformer_lens/model_bridge (TransformerLens 4.3).
NORMED = (
    "meaning: the bridge's hook_normalized is (x - mean) / scale before the norm's weight and bias "
    "(NormalizationBridge._hf_autograd_forward_with_hooks fires it on x_centered * rsqrt(var + eps)); probe's is the "
    "norm's output, weight and bias applied (equal only where the weight is 1 and there is no bias)"
)
QK_NORMED = (
    "layout: where the QK-norm is per head (Qwen3, Gemma 3, Apertus) the bridge fires hook_q_normed / hook_k_normed on "
    "[B, H, T, dh] (PositionEmbeddingsAttentionBridge, its post_reshape phase); probe's is B,T,H,dh like hook_q; "
    "equal after swapping dims 1 and 2"
)
SCORES_ARE_PATTERN = (
    "a defect of the bridge: where its AttentionBridge only wraps HF's attention module it fires hook_attn_scores "
    "on the module's second output, the post-softmax weights ('Most HF implementations return post-softmax "
    "weights', AttentionBridge.forward), so its hook_attn_scores is hook_pattern; probe's are the pre-softmax scores"
)
MOE_BLOCK = (
    "meaning: on a mixture-of-experts layer the bridge's mlp.hook_pre / hook_post are the MoE block's input and "
    "output (MoEBridge.hook_aliases: hook_in / hook_out, B,T,d); probe's are the pre-activation and the activation "
    "entering an output projection (B,T,m)"
)
DISAGREEMENTS = {
    **{(mt, "blocks.{l}.attn.hook_attn_scores"): SCORES_ARE_PATTERN for mt in ("gpt_neo", "gptj", "opt", "afmoe")},
    **{("*", f"blocks.{{l}}.{norm}.hook_normalized"): NORMED for norm in ("ln1", "ln2", "ln1_post", "ln2_post")},
    ("*", "ln_final.hook_normalized"): NORMED,
    **{
        (mt, f"blocks.{{l}}.attn.hook_{x}_normed"): QK_NORMED
        for mt in ("apertus", "gemma3_text", "qwen3")
        for x in "qk"
    },
    ("*", "blocks.{l}.mlp.hook_expert_weights"): (
        "layout: the bridge scatters the router's top-k weights to HookedTransformer's (B*T, n_experts), zeros "
        "elsewhere (MoERouterBridge._expand_expert_weights); probe's is the same weights as (B,T,E)"
    ),
    ("*", "blocks.{l}.mlp.hook_expert_indices"): (
        "layout: the bridge's is (B*T, k), probe's (B,T,k): the same indices, positions not flattened"
    ),
    **{(mt, f"blocks.{{l}}.attn.hook_{x}_normed"): QK_NORMED for mt in ("lfm2", "qwen3_next") for x in "qk"},
    **{
        (mt, "blocks.{l}.attn.hook_attn_scores"): (
            "convention: keys a row cannot see are -inf in probe's scores (TransformerLens's HookedTransformer), the "
            "bridge writes its mask value (the dtype's minimum) or leaves the entries of a chunked / sliding / "
            "mixture-of-heads mask unmasked; the visible entries are equal"
        )
        for mt in ("jetmoe", "gemma4_text", "llama4_text", "olmo_hybrid")
    },
    ("mpt", "blocks.{l}.attn.hook_attn_scores"): (
        "convention: probe's ALiBi bias is -slope * (i - j) (HF BLOOM's, zero on the diagonal), the bridge's MPT bias "
        "is slope * (j - T + 1): they differ by a constant per row, which the softmax ignores (patterns equal)"
    ),
    **{(mt, f"blocks.{{l}}.mlp.hook_{x}"): MOE_BLOCK for mt in ("mixtral",) for x in ("pre", "post")},
    **{("afmoe", f"blocks.1.mlp.hook_{x}"): MOE_BLOCK for x in ("pre", "post")},  # layer 0 is dense
    ("gemma4_text", "blocks.{l}.attn.hook_v"): (
        "meaning: Gemma 4 puts an RMSNorm without weight on the values (v_norm); the bridge's hook_v is v_proj's "
        "output before it (LinearBridge v.hook_out), probe's the value the attention reads, after it (equal to the "
        "bridge's with the v_norm applied)"
    ),
    ("qwen3_next", "blocks.{l}.attn.hook_q"): (
        "meaning: Qwen3-Next's q_proj carries each head's query and its output-gate logits side by side; the "
        "bridge's hook_q is q_proj's whole output viewed as 2H heads of dh (B,T,2H,dh), probe's the query half "
        "(B,T,H,dh; the gate is probe's hook_out_gate, after its sigmoid)"
    ),
}
SWAPPED = {QK_NORMED}  # layout differences that swapping the bridge's dims 1 and 2 undoes: equal after the swap


def expected(model_type: str, name: str) -> str | None:
    for key in ((model_type, name), (model_type, sbs.template(name)), ("*", sbs.template(name))):
        if key in DISAGREEMENTS:
            return DISAGREEMENTS[key]
    return None


def listed_for(model_type: str, name: str) -> bool:
    """Whether a disagreement is listed for this very family (a "*" entry may hold by chance: unit norm weights)."""
    return (model_type, name) in DISAGREEMENTS or (model_type, sbs.template(name)) in DISAGREEMENTS


@pytest.fixture(scope="module", params=sbs.ALL_FAMILIES)
def side(request, tmp_path_factory):
    """One folder per model_type, run once through probe, the bridge and nnsight; its comparison."""
    model_type = request.param
    folder = build_tiny(model_type, tmp_path_factory.mktemp("side_by_side") / model_type, seed=3)
    return model_type, sbs.compare(sbs.run(folder))


def test_every_shared_name_holds_the_same_tensor(side, record_property):
    model_type, c = side
    counts = c.counts()
    for k, v in counts.items():
        record_property(k, v)
    unequal = {n: d for n, d in c.diffs.items() if not d <= ATOL and expected(model_type, n) is None}
    unshaped = {n: s for n, s in c.unreconciled.items() if expected(model_type, n) is None}
    assert not unequal and not unshaped, (
        f"{model_type} {counts}: shared names that differ: "
        + ", ".join(f"{n} {d:.2e}" for n, d in sorted(unequal.items()))
        + (f"; shapes not reconcilable: {unshaped}" if unshaped else "")
    )
    # a layout difference is only a layout: equal once the bridge's dims are swapped back
    for n in c.unreconciled:
        if expected(model_type, n) in SWAPPED:
            assert c.swapped.get(n, float("inf")) <= ATOL, (model_type, n, c.swapped.get(n))
    # a disagreement listed for this family that is no longer one is stale
    stale = [
        n
        for n, d in c.diffs.items()
        if d <= ATOL and listed_for(model_type, n) and expected(model_type, n) not in SWAPPED
    ]  # (a swapped layout of one head reshapes into the other: equal, as it should be)
    assert not stale, f"{model_type}: listed as disagreeing but equal now: {stale}"


def test_the_counts_are_reported(side):
    model_type, c = side
    counts = c.counts()
    assert counts["probe"] == len(c.table["probe"]) > 0
    assert counts["shared"] + counts["only_probe"] == counts["probe"]
    assert counts["shared"] + counts["only_bridge"] == counts["bridge"]
    # the names every family has on both sides: the stream in every layer, the pattern on every softmax layer
    for l in range(c.n_layers):
        assert {f"blocks.{l}.hook_resid_pre", f"blocks.{l}.hook_resid_post"} <= c.table["shared"], (model_type, l)
        if f"blocks.{l}.attn.hook_pattern" in c.table["probe"]:
            assert f"blocks.{l}.attn.hook_pattern" in c.table["shared"], (model_type, l)
    assert "hook_embed" in c.table["shared"]
    # bridge internals never count: module-boundary hooks and the module tree below a component
    assert not any(n.endswith((".hook_in", ".hook_out")) for n in c.table["bridge"] - set(sbs.SHARED_BOUNDARY))
    assert not any(".q.hook_" in n or ".q_norm." in n for n in c.table["bridge"])


def test_nnsight_reads_the_same_tensors(side):
    model_type, c = side
    assert c.nnsight, f"{model_type}: nnsight compared nothing"
    for l in range(c.n_layers):
        assert f"blocks.{l}.hook_resid_post" in c.nnsight
    # no exceptions here: a module's output is what HF computes, which probe's names mean (the bridge's differences
    # of meaning above do not apply)
    unequal = {n: f"{d:.2e} ({path})" for n, (d, path) in c.nnsight.items() if not d <= ATOL}
    assert not unequal, f"{model_type}: probe's names differ from nnsight's module reads: {unequal}"


@torch.no_grad()
def test_the_comparison_reconciles_head_layouts_and_masks():
    a = torch.arange(24.0).reshape(2, 3, 4)
    b = a.reshape(2, 3, 2, 2)
    assert sbs.max_diff(*sbs.reconcile(a, b)) == 0
    assert sbs.max_diff(*sbs.reconcile(a[..., :1], a[..., 0])) == 0  # B,T,1 against B,T
    assert sbs.reconcile(a, a.transpose(1, 2)) is None  # a transposed layout is reported, not reshaped
    assert sbs.reconcile(a, torch.zeros(2, 3, 5)) is None  # reported, not skipped
    s = torch.tensor([[0.5, float("-inf")], [0.1, 0.2]])
    assert sbs.max_diff(s, s.nan_to_num(neginf=torch.finfo(torch.float32).min)) == 0  # a -inf mask = a dtype-min one
    assert sbs.max_diff(s, s.nan_to_num(neginf=0.0)) == float("inf")  # masked at different places


def test_the_page_reports_the_counts(side):
    """docs/reference/hook-names.md (written by benchmarks/hook_names.py) reports each family's current counts."""
    from pathlib import Path

    model_type, c = side
    page = Path(__file__).resolve().parents[2] / "docs" / "reference" / "hook-names.md"
    row = next((ln for ln in page.read_text(encoding="utf-8").splitlines() if ln.startswith(f"| `{model_type}` |")), "")
    n = c.counts()
    want = [c.n_layers, n["probe"], n["bridge"], n["shared"], n["only_probe"], n["only_bridge"]]
    cells = [x.strip() for x in row.split("|")[2:8]]
    assert cells == [str(v) for v in want], (
        f"{model_type}: the page says {cells}, the run {want} (layers, probe, bridge, shared, probe only, bridge only):"
        " run python benchmarks/hook_names.py"
    )
