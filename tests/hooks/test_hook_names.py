"""Hook names come from one place: the builders of probe.hooks.names spell the documented vocabulary
(docs/definitions.md#hook-namespace), and no other module of the package spells a hook name or a module path by hand."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from probe.hooks import names

PACKAGE = Path(__file__).resolve().parents[2] / "probe"
NAMES_MODULE = PACKAGE / "hooks" / "names.py"

# A string (f-string parts joined, each placeholder written {}) that spells a hook name or a module path of the
# vocabulary: a block path (blocks.{l} / blocks.3), a dotted hook (attn.hook_v, {site}.hook_depth_weights), a depth
# read site, or a model-level name. Prose that mentions a hook by its short name (hook_v_gate) is not matched.
HAND_BUILT = [
    re.compile(r"(?<![\w.])blocks\.(\{|\d)"),  # blocks.{l}... / blocks.3...
    re.compile(r"^blocks\.$"),  # "blocks." + str(l)
    re.compile(r"\.hook_\w"),  # attn.hook_v, {site}.hook_depth_weights, blocks.{}.hook_resid_pre
    re.compile(r"(?<![\w.])final_read\b"),
    re.compile(r"\.(attn|mlp)_read\b"),
    re.compile(r"^hook_embed$"),
]


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are docstrings (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and _text(first.value) is not None:
                out.add(id(first.value))
    return out


def _text(node: ast.AST) -> str | None:
    """The text of a string constant or f-string (placeholders as {}); None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def hand_built_names(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, text) of every string in ``source`` that spells a hook name or a hook module path by hand."""
    tree = ast.parse(source, filename)
    skip = _docstrings(tree)
    inner = set()  # the constant parts of f-strings are judged as part of their f-string
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inner.update(id(v) for v in node.values)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip or id(node) in inner:
            continue
        text = _text(node)
        if text is not None and any(p.search(text) for p in HAND_BUILT):
            found.append((node.lineno, text))
    return sorted(found)


def test_no_module_outside_names_spells_a_hook_name():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == NAMES_MODULE:
            continue
        for line, text in hand_built_names(path.read_text(), str(path)):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {text!r}")
    assert not offenders, "hook names built by hand (use probe.hooks.names):\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "source",
    [
        'n = f"blocks.{l}.attn.hook_pattern"',
        'n = f"blocks.{layer}.attn.gate.w"',
        'n = "blocks." + str(l) + ".hook_resid_pre"',
        'n = "blocks.{l}.hook_resid_pre".format(l=l)',
        'n = "blocks.3.attn"',
        'f = lambda n: n.endswith("attn.hook_v")',
        'n = f"{site}.hook_depth_weights"',
        'n = "final_read"',
        'n = "final_read.hook_depth_weights"',
        'n = f"blocks.{l}.mlp_read"',
        'n = "hook_embed"',
    ],
)
def test_the_scan_catches_hand_built_names(source):
    assert hand_built_names(source)


@pytest.mark.parametrize(
    "source",
    [
        'def f():\n    """Reads ``blocks.{l}.attn.hook_pattern`` and final_read."""\n',
        "# blocks.{l}.attn.hook_v in a comment\nx = 1\n",
        'needs = ["hook_pattern", "hook_v_gate"]',  # a LayerCollector's per-layer points, resolved by names.attn
        'msg = "the gate viewer needs hook_v_gate"',
        'title = "inputs of adjacent layers (blocks.l vs blocks.l+1 hook_resid_pre)"',
    ],
)
def test_the_scan_allows_docstrings_comments_and_short_names(source):
    assert hand_built_names(source) == []


# every builder against the name docs/reference/models.md and docs/definitions.md#hook-namespace document
DOCUMENTED = [
    (names.resid(0, "pre"), "blocks.0.hook_resid_pre"),
    (names.resid(3, "mid"), "blocks.3.hook_resid_mid"),
    (names.resid(11, "post"), "blocks.11.hook_resid_post"),
    (names.attn(2, "q"), "blocks.2.attn.hook_q"),
    (names.attn(2, "k"), "blocks.2.attn.hook_k"),
    (names.attn(2, "v"), "blocks.2.attn.hook_v"),
    (names.attn(2, "v_gate"), "blocks.2.attn.hook_v_gate"),
    (names.attn(2, "v_out"), "blocks.2.attn.hook_v_out"),
    (names.attn(2, "pattern"), "blocks.2.attn.hook_pattern"),
    (names.attn(2, "phantom"), "blocks.2.attn.hook_phantom"),
    (names.attn(2, "sink_logit"), "blocks.2.attn.hook_sink_logit"),
    (names.attn(2, "z"), "blocks.2.attn.hook_z"),
    (names.attn(2, "forget_gate"), "blocks.2.attn.hook_forget_gate"),
    (names.attn(1, "v_first"), "blocks.1.attn.hook_v_first"),
    (names.attn(1, "v_mix"), "blocks.1.attn.hook_v_mix"),
    (names.attn(4, "hook_pattern"), "blocks.4.attn.hook_pattern"),  # the HookPoint's attribute name works too
    (names.read_site(1, "attn"), "blocks.1.attn_read"),
    (names.read_site(0, "mlp"), "blocks.0.mlp_read"),
    (names.read_site(None), "final_read"),
    (names.routing_keys(names.read_site(1, "attn")), "blocks.1.attn_read.hook_routing_keys"),
    (names.depth_weights(names.read_site(2, "mlp")), "blocks.2.mlp_read.hook_depth_weights"),
    (names.routing_keys(names.FINAL_READ), "final_read.hook_routing_keys"),
    (names.depth_weights(names.FINAL_READ), "final_read.hook_depth_weights"),
    (names.read("blocks.5.attn_read", "depth_weights"), "blocks.5.attn_read.hook_depth_weights"),
    (names.dense(2), "blocks.2.dense.hook_weights"),
    (names.hc(2, "attn", "pre"), "blocks.2.hc_attn.hook_pre"),
    (names.hc(0, "mlp", "res"), "blocks.0.hc_mlp.hook_res"),
    (names.hc(1, "mlp", "read"), "blocks.1.hc_mlp.hook_read"),
    (names.streams(3), "blocks.3.hook_streams"),
    (names.hyper_head(), "hc_head.hook_pre"),
    (names.mlp(2), "blocks.2.mlp.hook_post"),
    (names.mlp(2, "post"), "blocks.2.mlp.hook_post"),
    (names.sublayer_out(2, "attn"), "blocks.2.hook_attn_out"),
    (names.sublayer_out(3, "mlp"), "blocks.3.hook_mlp_out"),
    (names.block(7), "blocks.7"),
    (names.attn_module(7), "blocks.7.attn"),
    (names.streams(2), "blocks.2.hook_streams"),
    (names.streams(2, "mid"), "blocks.2.hook_streams_mid"),
    (names.hc(2, "attn", "pre"), "blocks.2.hc_attn.hook_pre"),
    (names.hc(3, "mlp", "res"), "blocks.3.hc_mlp.hook_res"),
    (names.streams(2, "post"), "blocks.2.hook_streams_post"),
    (names.altup(1, "predict"), "blocks.1.altup.hook_predict"),
    (names.altup(1, "correct"), "blocks.1.altup.hook_correct"),
    (names.branch_out(3, "laurel"), "blocks.3.hook_laurel_out"),
    (names.branch_out(3, "per_layer"), "blocks.3.hook_per_layer_out"),
    (names.per_layer_input(3), "blocks.3.hook_per_layer_input"),
    (names.EMBED, "hook_embed"),
]


@pytest.mark.parametrize("built, documented", DOCUMENTED, ids=[d for _, d in DOCUMENTED])
def test_builder_gives_the_documented_name(built, documented):
    assert built == documented


def test_builders_agree_with_the_declared_templates():
    for l in (0, 5):
        assert names.resid(l, "pre") == names.name(names.RESID_PRE, l)
        assert names.resid(l, "mid") == names.name(names.RESID_MID, l)
        assert names.resid(l, "post") == names.name(names.RESID_POST, l)
        for point, template in [
            ("q", names.Q),
            ("k", names.K),
            ("v", names.V),
            ("v_gate", names.V_GATE),
            ("v_out", names.V_OUT),
            ("pattern", names.PATTERN),
            ("phantom", names.PHANTOM),
            ("sink_logit", names.SINK_LOGIT),
            ("out_gate", names.OUT_GATE),
            ("z", names.Z),
            ("v_first", names.V_FIRST),
            ("v_mix", names.V_MIX),
        ]:
            assert names.attn(l, point) == names.name(template, l)
        for kind in names.READ_KINDS:
            site = names.read_site(l, kind)
            assert names.depth_weights(site) == names.name(names.DEPTH_WEIGHTS, l, kind)
            assert names.routing_keys(site) == names.name(names.ROUTING_KEYS, l, kind)
        assert names.dense(l) == names.name(names.DENSE_WEIGHTS, l)
        assert names.mlp(l) == names.name(names.MLP_POST, l)
        assert names.sublayer_out(l, "attn") == names.name(names.ATTN_OUT, l)
        assert names.sublayer_out(l, "mlp") == names.name(names.MLP_OUT, l)
        assert names.streams(l) == names.name(names.STREAMS, l)
        assert names.streams(l, "mid") == names.name(names.STREAMS_MID, l)
        assert names.streams(l, "post") == names.name(names.STREAMS_POST, l)
        assert names.altup(l, "predict") == names.name(names.ALTUP_PREDICT, l)
        assert names.altup(l, "correct") == names.name(names.ALTUP_CORRECT, l)
        assert names.branch_out(l, "laurel") == names.name(names.LAUREL_OUT, l)
        assert names.branch_out(l, "per_layer") == names.name(names.PER_LAYER_OUT, l)
        assert names.per_layer_input(l) == names.name(names.PER_LAYER_INPUT, l)
        for site in names.HC_SITES:
            hc_templates = (
                ("pre", names.HC_PRE),
                ("post", names.HC_POST),
                ("res", names.HC_RES),
                ("read", names.HC_READ),
            )
            for point, template in hc_templates:
                assert names.hc(l, site, point) == names.name(template, l, site)
    assert names.depth_weights(names.FINAL_READ) == names.FINAL_DEPTH_WEIGHTS
    assert names.routing_keys(names.FINAL_READ) == names.FINAL_ROUTING_KEYS
    assert {f"hook_{p}" for p in names.ATTN_POINTS} >= set(names.ATTN_HOOKS)


@pytest.mark.parametrize("layer", [0, 1, 9, 23])
def test_layer_of_round_trips_every_block_builder(layer):
    built = (
        [names.resid(layer, p) for p in names.RESID_POINTS]
        + [names.attn(layer, p) for p in names.ATTN_POINTS]
        + [names.read_site(layer, k) for k in names.READ_KINDS]
        + [names.depth_weights(names.read_site(layer, k)) for k in names.READ_KINDS]
        + [names.dense(layer), names.mlp(layer), names.block(layer), names.attn_module(layer)]
        + [names.hc(layer, k, p) for k in names.SUBLAYERS for p in names.HC_POINTS]
        + [names.streams(layer, p) for p in names.STREAM_POINTS]
        + [names.sublayer_out(layer, k) for k in names.SUBLAYERS]
        + [names.altup(layer, p) for p in names.ALTUP_POINTS]
        + [names.branch_out(layer, k) for k in names.BRANCHES]
        + [names.per_layer_input(layer)]
    )
    assert [names.layer_of(n) for n in built] == [layer] * len(built)


def test_layer_of_is_none_for_model_level_names():
    final = (names.FINAL_READ, names.depth_weights(names.FINAL_READ), names.routing_keys(names.FINAL_READ))
    for n in (names.EMBED, *final):
        assert names.layer_of(n) is None


def test_numpy_and_torch_integers_are_layers():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    assert names.attn(np.int64(3), "v") == names.attn(torch.tensor(3), "v") == "blocks.3.attn.hook_v"


def test_attn_point_and_is_attn_read_names_back():
    assert names.attn_point(names.attn(3, "v_gate")) == "v_gate"
    assert names.attn_point(names.resid(3, "pre")) is None
    assert names.attn_point("blocks.3.attn.hook_nonsense") is None
    assert names.is_attn(names.attn(0, "v"), "v")
    assert not names.is_attn(names.attn(0, "v_out"), "v")  # a suffix test would take hook_v_out for hook_v's prefix
    assert names.is_attn(names.attn(5, "phantom"), "pattern", "phantom")
    assert not names.is_attn(names.depth_weights(names.FINAL_READ), "pattern")


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: names.attn(0, "patern"),
            "unknown attention hook 'patern'; choose from q, k, q_normed, k_normed, rot_q",
        ),
        (lambda: names.resid(0, "middle"), "unknown residual point 'middle'; choose from pre, mid, post"),
        (lambda: names.read_site(0, "ffn"), "unknown read site 'ffn'; choose from attn, mlp"),
        (lambda: names.mlp(0, "pee"), "unknown MLP hook 'pee'; choose from pre, pre_linear, post"),
        (lambda: names.read("blocks.0.attn", "depth_weights"), "unknown depth read site 'blocks.0.attn'"),
        (lambda: names.depth_weights(names.read_site(0, "mlp")[:-1]), "unknown depth read site"),
        (lambda: names.read(names.FINAL_READ, "weights"), "unknown read hook 'weights'; choose from routing_keys"),
        (lambda: names.is_attn("blocks.0.attn.hook_v", "values"), "unknown attention hook 'values'"),
        (lambda: names.attn(-1, "v"), "a layer index is an int >= 0, got -1"),
        (lambda: names.attn(1.0, "v"), "a layer index is an int >= 0, got 1.0"),
        (lambda: names.dense(True), "a layer index is an int >= 0, got True"),
        (lambda: names.altup(0, "router"), "unknown AltUp point 'router'; choose from predict, correct"),
        (lambda: names.branch_out(0, "attn"), "unknown branch 'attn'; choose from laurel, per_layer"),
        (lambda: names.streams(0, "out"), "unknown stream point 'out'; choose from pre, mid, post"),
    ],
)
def test_bad_points_and_layers_name_the_valid_choices(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


@pytest.mark.parametrize(
    "variant, overrides",
    [
        ("attnres-full", {}),
        ("plr-block2-r8", {}),
        ("mudd", {}),
        ("sink+proj", {"value_residual": "lambda"}),
    ],
)
def test_every_hook_of_a_model_is_a_built_name(variant, overrides):
    """The hooks a probe model exposes (read off its module tree) are names the builders give, and the documented
    ones for its mechanisms are there."""
    from probe.models import create

    model = create(variant, "tiny", n_layers=2, d_model=32, n_heads=2, d_mlp=64, vocab_size=64, **overrides)
    hooks = set(model.hook_dict)
    L = model.probe_info.n_layers
    assert sorted(hooks - _all_built(L)) == []
    assert names.EMBED in hooks
    for l in range(L):
        assert {names.resid(l, p) for p in names.RESID_POINTS} | {names.mlp(l)} <= hooks
        assert {names.attn(l, p) for p in ("q", "k", "v", "v_out", "pattern", "phantom", "z")} <= hooks
    for site in model.probe_info.extra.get("depth_sites", {}):
        assert names.depth_weights(site) in hooks
    if variant == "mudd":
        assert {names.dense(l) for l in range(L)} <= hooks
    if variant == "sink+proj":
        assert {names.attn(l, p) for l in range(L) for p in ("v_gate", "sink_logit", "v_first", "v_mix")} <= hooks


@pytest.mark.parametrize("family", ["gpt_neox", "gpt_oss", "gemma2", "deepseek_v4", "gemma3n_text"])
def test_every_hook_of_an_hf_adapter_is_a_built_name(family):
    """The HF adapters expose the same vocabulary: every hook is a built name, and the per-layer ones are there."""
    from probe.checkpoints.interop import wrap
    from probe.checkpoints.tiny import tiny_model

    model = wrap(tiny_model(family))
    hooks = set(model.hook_dict)
    L = model.probe_info.n_layers
    assert sorted(hooks - _all_built(L)) == []
    points = ("q", "k", "v", "v_out", "pattern", "phantom", "z") + (("sink_logit",) if family == "gpt_oss" else ())
    for l in range(L):
        assert {names.resid(l, p) for p in names.RESID_POINTS} | {names.attn(l, p) for p in points} <= hooks
        assert {names.sublayer_out(l, k) for k in names.SUBLAYERS} <= hooks
    assert names.EMBED in hooks


def _all_built(L: int) -> set[str]:
    out = {names.EMBED, names.depth_weights(names.FINAL_READ), names.routing_keys(names.FINAL_READ), names.hyper_head()}
    out |= {names.pos_embed(), names.unembed_in()} | {names.norm(None, point=p) for p in names.NORM_POINTS}
    out |= {names.norm(l, w, p) for l in range(L) for w in names.NORMS for p in names.NORM_POINTS}
    out |= {names.mlp(l, p) for l in range(L) for p in names.MLP_POINTS}
    for l in range(L):
        out |= {names.resid(l, p) for p in names.RESID_POINTS} | {names.attn(l, p) for p in names.ATTN_POINTS}
        out |= {names.read(names.read_site(l, k), p) for k in names.READ_KINDS for p in names.READ_POINTS}
        out |= {names.dense(l), names.mlp(l)} | {names.sublayer_out(l, k) for k in names.SUBLAYERS}
        out |= {names.streams(l, p) for p in names.STREAM_POINTS}
        out |= {names.hc(l, s, p) for s in names.HC_SITES for p in names.HC_POINTS}
        out |= {names.altup(l, p) for p in names.ALTUP_POINTS} | {names.branch_out(l, k) for k in names.BRANCHES}
        out.add(names.per_layer_input(l))
    return out
