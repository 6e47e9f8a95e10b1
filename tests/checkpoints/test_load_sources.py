"""probe.load's shape: one loader per source kind that resolve() returns (LOADERS), one builder per format a config
names (FORMATS), one LoadRequest passed between them, and every function of the module short."""

from __future__ import annotations

import ast
import inspect

import pytest

import probe
from probe.checkpoints import load as L
from probe.checkpoints import muddformer


def _kinds_resolve_returns(tmp_path) -> set[str]:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "w.gguf").write_bytes(b"")
    (tmp_path / "final_model.pt").write_bytes(b"")
    names = [str(folder), str(tmp_path / "w.gguf"), str(tmp_path / "final_model.pt"), "pythia-70m"]
    names += [f"probe/{L.zoo_names()[0]}"] if L.zoo_names() else []
    return {L.resolve(n)[2] for n in names}


def test_every_source_kind_has_one_loader(tmp_path):
    assert set(L.LOADERS) == {"hub", "gguf", "zoo", "local", "lr-attnres"}
    assert _kinds_resolve_returns(tmp_path) <= set(L.LOADERS)


@pytest.mark.parametrize(
    "model_type, builder",
    [(t, "mudd") for t in muddformer.MODEL_TYPES] + [("probe", "probe"), ("llama", "hf"), (None, "hf")],
)
def test_a_config_chooses_its_builder(model_type, builder):
    assert L._format_of(model_type) == builder
    assert set(L.FORMATS) == {"mudd", "probe", "hf"}


def test_load_hands_its_loader_one_request(monkeypatch):
    seen = []
    monkeypatch.setitem(L.LOADERS, "hub", lambda req: seen.append(req) or "model")
    assert probe.load("pythia-70m", revision="step1000", device="cpu", dtype="bf16", token="t") == "model"
    (req,) = seen
    assert (req.name, req.target, req.revision, req.kind) == ("pythia-70m", "EleutherAI/pythia-70m", "step1000", "hub")
    assert (req.device, req.dtype, req.rope, req.hf_kwargs) == ("cpu", "bf16", None, {"token": "t"})
    assert req.source == req.target and req.identity == "" and not req.local_only and not req.placed


def test_a_conflicting_revision_is_refused_before_any_loader(monkeypatch):
    monkeypatch.setitem(L.LOADERS, "hub", lambda req: pytest.fail("loader reached"))
    with pytest.raises(ValueError, match="conflicts"):
        probe.load("pythia-70m@step1000", revision="step2000")


def _lengths() -> dict[str, int]:
    tree = ast.parse(inspect.getsource(L))
    return {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_no_function_of_the_module_is_long():
    lengths = _lengths()
    assert {name: n for name, n in lengths.items() if n > 80} == {}
    loaders = [f.__name__ for f in (*L.LOADERS.values(), *L.FORMATS.values())]
    assert {name: lengths[name] for name in loaders if lengths[name] > 30} == {}
