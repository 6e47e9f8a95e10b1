"""The one-way dependency order (docs/architecture.md), read off the source: no import against it, no import circle
between files or between packages. Function-level imports count like top-level ones (a lazy import is still a
dependency). The level table of docs/architecture.md is this test's LEVELS."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "probe"
PAGE = PACKAGE.parent / "docs" / "architecture.md"

# A <- B means B may import A. Each top-level package or module of probe sits on one level; a unit may import units of
# its own level or below, never above. The root ``probe/__init__.py`` (lazy ``probe.load`` / ``probe.materialize``) is
# the public face and stands outside the order.
LEVELS = {
    # vocabulary, fused ops, text and tokens, and the stdlib-only leaves every layer may use
    "hooks": 0,
    "kernels": 0,
    "data": 0,
    "runs": 0,
    "progress": 0,
    "writes": 0,
    "errors": 0,  # the one-line user error (exit 2) every level may raise
    "console": 0,  # notes on stderr, silent with --quiet
    "options": 0,  # argparse option types and options declared on config dataclasses
    "process_group": 0,  # torchrun's process group: joining it, ranks, the batches a rank takes
    "declared": 0,  # module-level constants read from source (the verbs, the files' descriptions) without importing
    "optional": 0,  # optional dependencies (triton, kaleido, gguf): probed once, a broken one disabled
    "catalogue": 0,  # the custom models' variant and tier names, plain data (`probe models` reads them without torch)
    "models": 1,  # custom instrumented transformers
    "checkpoints": 2,  # name -> model, HF adapters, interop, tiny HF models for tests
    "analyses": 3,  # captured tensors -> DataFrames (compute only: no files, pages or stdout)
    "present": 4,  # figures, page sections, terminal text, result files and pages
    "jobs": 5,
    "train": 5,  # run specs, inputs and windows, the resumable store, the report; training
    "experiments": 6,  # the papers' recipes
    "cli": 7,  # the command line
}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _owner(name: str, mods) -> str | None:
    """The module file an import of ``name`` executes (``probe.a.b.func`` -> ``probe.a.b``)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _edges(mods) -> set[tuple[str, str, int]]:
    edges = set()
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                owner = _owner(target, mods) if target.split(".")[0] == "probe" else None
                if owner and owner != name:
                    edges.add((name, owner, node.lineno))
    return edges


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the root package


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


MODULES = _modules()
EDGES = _edges(MODULES)


def test_every_unit_has_a_level():
    units = {_unit(m) for m in MODULES} - {None}
    assert units - set(LEVELS) == set(), "place each new top-level package or module on a level in LEVELS"


def page_levels(text: str) -> dict[str, int]:
    """{unit: level} from the level table of docs/architecture.md (rows ``| N | `unit`, `unit` | ... |``)."""
    found = {}
    for level, units in re.findall(r"^\| (\d) \| ([^|]+) \|", text, re.M):
        for unit in re.findall(r"`(\w+)`", units):
            found[unit] = int(level)
    return found


def test_the_architecture_page_shows_these_levels():
    assert page_levels(PAGE.read_text(encoding="utf-8")) == LEVELS
    moved = PAGE.read_text(encoding="utf-8").replace("| 5 | `jobs`, `train` |", "| 5 | `jobs` |\n| 6 | `train` |")
    assert page_levels(moved) != LEVELS  # a unit put on another level is seen


def test_imports_follow_the_one_way_order():
    against = sorted(
        f"{a}:{line} imports {b} ({_unit(a)} level {LEVELS.get(_unit(a))} < {_unit(b)} level {LEVELS.get(_unit(b))})"
        for a, b, line in EDGES
        if _unit(a) and _unit(b) and LEVELS.get(_unit(b), 99) > LEVELS.get(_unit(a), -1)
    )
    assert against == []


def test_no_import_circles_between_files():
    graph = defaultdict(set)
    for a, b, _ in EDGES:
        graph[a].add(b)
    assert _cycles(graph) == []


def test_no_import_circles_between_packages():
    graph = defaultdict(set)
    for a, b, _ in EDGES:
        if _unit(a) and _unit(b) and _unit(a) != _unit(b):
            graph[_unit(a)].add(_unit(b))
    assert _cycles(graph) == []


# What a higher unit may take from a lower one beyond the level order: training is not presentation or analysis, and a
# job takes from presentation only the pages it publishes (their builders and the write of a page's files).
NARROW = {
    "train": {"present": set(), "analyses": set()},
    "jobs": {"present": {"probe.present.report", "probe.present.report_ctx", "probe.present.files"}},
}


def _narrow_violations(edges) -> list[str]:
    return sorted(
        f"{a}:{line} imports {b}"
        for a, b, line in edges
        if _unit(a) in NARROW and _unit(b) in NARROW[_unit(a)] and b not in NARROW[_unit(a)][_unit(b)]
    )


def test_train_and_jobs_take_no_utilities_from_presentation_or_analyses():
    assert _narrow_violations(EDGES) == []
    planted = {("probe.train.config", "probe.present.terminal", 1), ("probe.jobs.store", "probe.present.report", 2)}
    assert _narrow_violations(planted) == ["probe.train.config:1 imports probe.present.terminal"]


# Presentation draws what the analyses captured: no module under probe/present imports a deep-learning library or the
# packages that build, load or hook a model, and none calls a model's forward or hooks (`probe view`'s capture lives in
# probe/analyses/view.py). The one exemption takes a constant, not a model.
MODEL_LIBRARIES = {"torch", "transformers", "transformer_lens", "nnsight", "triton", "accelerate", "safetensors"}
MODEL_UNITS = ("probe.models", "probe.checkpoints", "probe.hooks", "probe.kernels")
RUNS_A_MODEL = {
    "run_with_cache",
    "run_with_hooks",
    "hooks",
    "forward",
    "generate",
    "register_forward_hook",
    "register_forward_pre_hook",
    "no_grad",
    "inference_mode",
}
PRESENT_EXEMPT = {("probe.present.models", "probe.checkpoints.load.PYTHIA_SIZES")}  # `probe models`: the size names


def _model_use(name: str, source: str) -> list[str]:
    """Where module ``name`` imports a model library or unit, or calls what runs a model: 'name:line what'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            targets = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute) and node.attr in RUNS_A_MODEL:
            found.append(f"{name}:{node.lineno} .{node.attr}")
            continue
        else:
            continue
        for target in targets:
            library = target.split(".")[0] in MODEL_LIBRARIES
            unit = target.startswith(tuple(u + "." for u in MODEL_UNITS)) or target in MODEL_UNITS
            if (library or unit) and (name, target) not in PRESENT_EXEMPT:
                found.append(f"{name}:{node.lineno} imports {target}")
    return found


def test_presentation_runs_no_model():
    present = {m: p for m, p in MODULES.items() if m == "probe.present" or m.startswith("probe.present.")}
    assert "probe.present.viewers" in present
    assert [hit for m, p in sorted(present.items()) for hit in _model_use(m, p.read_text())] == []


@pytest.mark.parametrize(
    "planted",
    [
        "import torch\n",
        "import torch.nn.functional as F\n",
        "from transformers import AutoModelForCausalLM\n",
        "def f():\n    import nnsight\n",
        "from probe.models import create\n",
        "from probe.hooks import names\n",
        "from probe.checkpoints.load import load\n",
        "def f(model, ids):\n    return model.run_with_cache(ids)\n",
        "def f(model):\n    with model.hooks(fwd_hooks=[]):\n        pass\n",
    ],
)
def test_the_presentation_check_sees_a_planted_model_use(planted):
    assert _model_use("probe.present.viewers", planted)
    assert _model_use("probe.present.models", "from probe.checkpoints.load import PYTHIA_SIZES\n") == []


@pytest.mark.parametrize(
    "moved",
    [
        "probe/hooks/load.py",
        "probe/hooks/interop.py",
        "probe/hooks/adapters",
        "probe/hooks/hooked_hf.py",
        "probe/cli.py",
        "probe/cli_common.py",
        "probe/cli_misc.py",
        "probe/cli_analyses.py",
        "probe/cli_output.py",
        "probe/present/errors.py",
        "probe/present/console.py",
        "probe/present/options.py",
    ],
)
def test_moved_modules_are_gone_not_shimmed(moved):
    assert not (PACKAGE.parent / moved).exists()


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    """The rules above would fail on an upward import and on a circle (guards against a checker that sees nothing)."""
    fake = {"probe.hooks.names": tmp_path / "a.py", "probe.cli.main": tmp_path / "b.py"}
    fake["probe.hooks.names"].write_text("from probe.cli.main import main\n")
    fake["probe.cli.main"].write_text("import probe.hooks.names\n")
    edges = _edges(fake)
    assert ("probe.hooks.names", "probe.cli.main", 1) in edges
    graph = defaultdict(set)
    for a, b, _ in edges:
        graph[a].add(b)
    assert _cycles(graph) == [["probe.cli.main", "probe.hooks.names"]]
