"""MUDDFormer / MUDDPythia configs as their code takes them: what it runs loads as it computes, what it ignores is
ignored with one warning, what it cannot run is refused in one line.

tests/fixtures/authors/mudd-configs/ (scripts/authors/mudd_configs.py) holds their config classes' fields and
defaults, and for variants of a tiny base config (one key changed, or a key their class does not define, or a
sequence past block_size) whether their code ran it (else its error), the config.json save_pretrained wrote, the
weights and their fp64 logits. Here probe reads each through probe.load, without their code.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import probe
from probe.checkpoints import muddformer
from probe.checkpoints.muddformer import AuthorsFormatError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "authors" / "mudd-configs"
META = json.loads((FIXTURE / "meta.json").read_text())
FP64_TOL = 1e-10
RUNS = sorted(k for k, v in META["variants"].items() if v["runs"])
FAILS = sorted(k for k, v in META["variants"].items() if not v["runs"])


def checkpoint(key: str, tmp_path: Path) -> Path:
    """The variant's checkpoint directory: its config.json and the weights of ``weights_from``."""
    v = META["variants"][key]
    d = tmp_path / key
    d.mkdir()
    shutil.copy(FIXTURE / "checkpoints" / key / "config.json", d)
    shutil.copy(FIXTURE / "checkpoints" / v.get("weights_from", f"{v['family']}-base") / "model.safetensors", d)
    return d


def their_config(key: str) -> dict:
    v = META["variants"][key]
    return {**META["families"][v["family"]]["base"], **{k: x for k, x in v["edit"].items() if k != "T"}}


def test_probe_reads_the_fields_their_config_classes_define():
    """probe's FIELDS (a missing key takes its default) are their config classes' __init__ keywords and defaults."""
    for family, record in META["families"].items():
        assert muddformer.FIELDS[family] == record["fields"], family


@pytest.mark.parametrize("key", RUNS)
def test_a_config_their_code_runs_loads_as_it_computes(key, tmp_path):
    v = META["variants"][key]
    ids = load_file(FIXTURE / "inputs.safetensors")[f"T{v['T']}"]
    ignored = muddformer.ignored_keys(their_config(key), v["family"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = probe.load(checkpoint(key, tmp_path), dtype=torch.float64)
    said = [str(w.message) for w in caught if "does not read" in str(w.message)]
    assert len(said) == (1 if ignored else 0) and all(k in said[0] for k in ignored), said
    with torch.no_grad():
        diff = (model(ids).logits - load_file(FIXTURE / "outputs.safetensors")[key]).abs().max().item()
    assert diff <= FP64_TOL, (key, diff)
    assert model.config.rope_table == muddformer.AUTHORS_ROPE[v["family"]]
    assert model.probe_info.extra["authors_format"]["format"] == v["family"]


def test_the_ignored_keys_are_exactly_those_their_classes_lack():
    assert muddformer.ignored_keys(their_config("muddformer-use_cache"), "muddformer") == ["use_cache"]
    assert muddformer.ignored_keys(their_config("muddformer-pythia_key"), "muddformer") == ["use_parallel_residual"]
    assert muddformer.ignored_keys(their_config("muddpythia-serial_residual"), "muddpythia") == []
    assert META["variants"]["muddformer-use_cache"]["same_logits_as"] == "muddformer-base"


@pytest.mark.parametrize("key", FAILS)
def test_a_config_their_code_cannot_run_is_one_line(key, tmp_path):
    """Each config their code failed on (the error recorded) is refused by probe in one line naming the key; a
    sequence past block_size at the forward, as theirs."""
    v = META["variants"][key]
    if "T" in v["edit"]:
        model = probe.load(checkpoint(f"{v['family']}-base", tmp_path), dtype=torch.float64)
        ids = load_file(FIXTURE / "inputs.safetensors")[f"T{v['T']}"]
        with pytest.raises(ValueError, match=f"T={v['T']} exceeds the maximum context 8 ") as e:  # models.inputs
            model(ids)
    else:
        d = tmp_path / key
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**their_config(key), "model_type": v["family"]}))
        with pytest.raises(AuthorsFormatError) as e:
            muddformer.probe_config(muddformer.probe_config_kwargs(their_config(key), key), key)
        named = [k for k in v["edit"] if k not in ("sepln", "dim")] or list(v["edit"])
        assert any(k in str(e.value) for k in named), (str(e.value), v["error"])
    assert "\n" not in str(e.value)


def test_tie_word_embeddings_computes_untied(tmp_path):
    """Their tie_weights() is a no-op: with tie_word_embeddings=true the output matrix is still its own; recorded."""
    model = probe.load(checkpoint("muddformer-tie_word_embeddings", tmp_path), dtype=torch.float64)
    assert not model.config.tie_embeddings and not torch.equal(model.lm_head.weight, model.embed.weight)
    assert "tie_word_embeddings" in model.probe_info.extra["authors_format"]["notes"]


def test_rope_exact_is_probe_s_table_and_moves_the_logits(tmp_path):
    ids = load_file(FIXTURE / "inputs.safetensors")["T8"]
    theirs = load_file(FIXTURE / "outputs.safetensors")["muddformer-base"]
    model = probe.load(checkpoint("muddformer-base", tmp_path), dtype=torch.float64, rope="exact")
    assert model.config.rope_table == "exact" and model.probe_info.extra["authors_format"]["rope"] == "exact"
    with torch.no_grad():
        assert (model(ids).logits - theirs).abs().max() > 1e-4
    with pytest.raises(AuthorsFormatError, match="rope='fp32' is not valid"):
        probe.load(checkpoint("muddformer-mqa", tmp_path), rope="fp32")
