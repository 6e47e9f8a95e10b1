"""Analyses, pages and verbs read what a mechanism does (ModelInfo's capability fields, declared by the gate registry
and the model), never its name: no module under probe/analyses, probe/present or probe/cli compares a gate, variant,
depth or abstention name with a string literal. A new mechanism registered the way docs/how-to/adding-a-mechanism.md
says is then analysed as its declaration says, without editing an analysis."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("probe/analyses", "probe/present", "probe/cli")
# names whose values are mechanism names: ModelInfo.value_gate / out_gate / depth_routing, ProbeConfig.value_gate /
# out_gate / depth / dense / abstention, and a variant's name
NAME_FIELDS = {"value_gate", "out_gate", "depth_routing", "depth", "dense", "abstention", "variant"}
# comparisons with a mechanism-named string that are not about a model: the cost model's `method` is a row of
# LR-AttnRes 2026 Table 1 ("baseline", "attnres", "p-lr", "s-lr"), an argument of a formula, not a model's mechanism
ALLOWED = {("probe/analyses/costs.py", "method")}


def _mechanism_names() -> set[str]:
    from probe.models import OUT_GATES, VARIANTS
    from probe.models.gates import GATES

    variants = {v for v in VARIANTS if "{" not in v} | {v.split("{")[0].rstrip("-") for v in VARIANTS}
    return variants | set(GATES) | set(OUT_GATES)


def _operand_name(node: ast.AST) -> str | None:
    """The field an operand reads: x.value_gate, value_gate, meta["value_gate"], x.get("value_gate") -> 'value_gate'."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value if isinstance(node.slice.value, str) else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        first = node.args[0]
        return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
    return None


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def name_comparisons(source: str, path: str, mechanism_names: set[str]) -> list[str]:
    """Every comparison in ``source`` of a mechanism-name field with a string literal, or of anything with a
    registered variant or gate name (==, !=, in, not in, against a literal or a literal tuple/list/set)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare) or not all(
            isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
        ):
            continue
        operands = [node.left, *node.comparators]
        literals = [s for o in operands for s in _strings(o)]
        if not literals:
            continue
        fields = {_operand_name(o) for o in operands} - {None}
        if (path, next(iter(fields), None)) in ALLOWED and len(fields) == 1:
            continue
        if fields & NAME_FIELDS or set(literals) & mechanism_names:
            found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_analysis_page_or_verb_compares_mechanism_names():
    names = _mechanism_names()
    found = []
    for folder in CHECKED:
        for f in sorted((ROOT / folder).rglob("*.py")):
            rel = f.relative_to(ROOT).as_posix()
            found += name_comparisons(f.read_text(encoding="utf-8"), rel, names)
    assert not found, (
        "compare capabilities (ModelInfo.has_value_gate, gate_on_logits, has_depth_sources, "
        "has_phantom, sink_token; a gate's declared direction) instead of names:\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "line",
    [
        'if info.value_gate == "none": pass',
        'if info.value_gate != "none": pass',
        'x = info.depth_routing in ("attnres", "plr", "slr")',
        'x = meta["value_gate"] == "proj"',
        'x = cfg.get("abstention") == "sinktoken"',
        'x = variant == "routing-normgate"',
        'x = name in ("normgate", "projgate")',
    ],
)
def test_the_check_catches_name_comparisons(line):
    """The check finds each way the old code compared names (it found the ones capabilities replaced)."""
    assert name_comparisons(line, "probe/analyses/x.py", _mechanism_names())


@pytest.mark.parametrize(
    "line",
    [
        "if not info.has_value_gate: pass",
        "x = info.gate_on_logits and info.has_depth_sources",
        'x = text.lower() == "none"',  # an option's text, not a mechanism
        'x = method == "baseline"',  # the cost model's Table 1 row (allowed in costs.py only)
    ],
)
def test_the_check_passes_capabilities(line):
    assert not name_comparisons(line, "probe/analyses/costs.py", _mechanism_names())
