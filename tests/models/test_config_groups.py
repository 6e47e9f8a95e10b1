"""ProbeConfig's options grouped by concern (probe.models.config.GROUPS): saved configs of every earlier version load
to the same config, every keyword argument belongs to exactly one group, and each group refuses its own bad values in
one line that names the field.

The golden file tests/fixtures/config_groups_golden.json was written by the ProbeConfig that assigned each field by
hand: for every config.json of a probe model shipped in the repository, ``from_json_file(path).to_dict()`` and
``to_diff_dict()``; for a set of keyword arguments (each tier's variants, every option off its default, one bad value
per rule), ``ProbeConfig(**kwargs).to_dict()`` or the ValueError's message; and the keyword arguments it took.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from probe.models.config import GROUPS, ProbeConfig

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((ROOT / "tests" / "fixtures" / "config_groups_golden.json").read_text(encoding="utf-8"))
# the installed transformers' version, written into every to_dict: not the config's own content
UNSTAMPED = ("transformers_version",)
# fields added after the golden file was written, with their defaults: a config the golden file records without the
# field must have it at this default (a saved config.json without it loads as before), and then it is left out
ADDED = {
    "attn_fn": "softmax",
    "forget_gate": False,
    "hyper": "none",
    "hc_streams": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
}


def _plain(d: dict, golden: dict | None = None) -> str:
    """Its JSON text, sorted, without the version stamp: True and 1, 1.0 and 1 differ, as they do in config.json.
    With ``golden`` (the recorded dict it is compared with), a field of ADDED absent there is left out where it has
    its default, and kept (so the comparison fails) where it does not."""
    added = {k for k, v in ADDED.items() if golden is not None and k not in golden and d.get(k, v) == v}
    return json.dumps({k: v for k, v in d.items() if k not in UNSTAMPED and k not in added}, sort_keys=True)


def _shipped() -> list[str]:
    """Every config.json of a probe model in the repository (the zoo, test fixtures), relative to the root."""
    found = []
    for path in ROOT.rglob("config.json"):
        rel = path.relative_to(ROOT)
        if rel.parts[0].startswith("."):
            continue
        if '"model_type": "probe"' in path.read_text(encoding="utf-8"):
            found.append(rel.as_posix())
    return sorted(found)


@pytest.mark.parametrize("rel", sorted(GOLDEN["files"]))
def test_a_saved_config_loads_as_it_did(rel):
    config = ProbeConfig.from_json_file(ROOT / rel)
    recorded = GOLDEN["files"][rel]
    assert _plain(config.to_dict(), recorded["to_dict"]) == _plain(recorded["to_dict"])
    assert _plain(config.to_diff_dict(), recorded["to_diff_dict"]) == _plain(recorded["to_diff_dict"])


def test_every_shipped_config_has_a_golden_entry():
    assert set(_shipped()) <= set(GOLDEN["files"]), "record the new config.json in the golden file"
    assert len(GOLDEN["files"]) >= 20


@pytest.mark.parametrize("rel", _shipped())
def test_a_shipped_config_survives_save_and_load(rel, tmp_path):
    config = ProbeConfig.from_json_file(ROOT / rel)
    config.save_pretrained(tmp_path)
    again = ProbeConfig.from_pretrained(tmp_path)
    assert _plain(again.to_dict()) == _plain(config.to_dict())


@pytest.mark.parametrize("entry", GOLDEN["built"], ids=[e["name"] for e in GOLDEN["built"]])
def test_keyword_arguments_build_the_config_they_did(entry):
    if "error" in entry:
        with pytest.raises(ValueError) as err:
            ProbeConfig(**entry["kwargs"])
        assert str(err.value) == entry["error"]
    else:
        assert _plain(ProbeConfig(**entry["kwargs"]).to_dict(), entry["to_dict"]) == _plain(entry["to_dict"])


def test_every_keyword_argument_belongs_to_exactly_one_group():
    names = [f.name for group in GROUPS.values() for f in dataclasses.fields(group)]
    assert len(names) == len(set(names)), "a field in two groups"
    assert set(names) == set(GOLDEN["parameters"]) | set(ADDED)
    signature = inspect.signature(ProbeConfig)
    assert [p for p in signature.parameters if p != "kwargs"] == names
    for group in GROUPS.values():
        for f in dataclasses.fields(group):
            assert signature.parameters[f.name].default == f.default


def test_the_defaults_derived_from_other_fields():
    c = ProbeConfig(d_model=96, n_heads=3)
    assert (c.n_kv_heads, c.d_head, c.d_value) == (3, 32, 32)
    c = ProbeConfig(d_head=40, linear_bias=True)
    assert (c.d_value, c.mlp_bias) == (40, True)
    assert ProbeConfig(linear_bias=True, mlp_bias=False).mlp_bias is False
    assert ProbeConfig().tie_word_embeddings is False
    assert "backend" not in ProbeConfig(backend="triton").to_dict()


def test_a_config_without_plr_key_loads_raw(tmp_path):
    saved = ProbeConfig().to_dict()
    del saved["plr_key"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(saved), encoding="utf-8")
    assert ProbeConfig.from_json_file(path).plr_key == "raw"
    assert ProbeConfig.from_pretrained(tmp_path).plr_key == "raw"
    assert ProbeConfig().plr_key == "normalized"


def test_a_group_reads_back_the_config_values():
    c = ProbeConfig(depth="plr", depth_rank=16, depth_blocks=4, n_heads=8, n_kv_heads=2, out_gate="headwise")
    depth = c.group("depth")
    assert type(depth) is GROUPS["depth"]
    assert (depth.depth, depth.depth_rank, depth.depth_blocks) == ("plr", 16, 4)
    assert (c.group("attention").n_kv_heads, c.group("out_gate").out_gate) == (2, "headwise")
    for name, group in GROUPS.items():
        assert dataclasses.asdict(c.group(name)) == {f.name: getattr(c, f.name) for f in dataclasses.fields(group)}
    with pytest.raises(ValueError, match="group='nope' is not valid"):
        c.group("nope")
    assert "group" not in c.to_dict()


def test_validate_sees_an_attribute_changed_after_init():
    c = ProbeConfig()
    c.value_gate = "glu"
    c.validate()
    c.value_residual = "lambda"
    with pytest.raises(ValueError, match="value_residual does not compose"):
        c.validate()


# one bad value per group: (group, field, value)
BAD = [
    ("architecture", "mlp", "relu"),
    ("architecture", "init", "xavier"),
    ("architecture", "d_mlp_layers", [384]),
    ("attention", "abstention", "maybe"),
    ("attention", "qk_activation", "k"),
    ("attention", "attn_fn", "nope"),
    ("attention", "n_kv_heads", 3),
    ("norm_position", "norm", "batch"),
    ("norm_position", "pos", "alibi"),
    ("norm_position", "rope_table", "half"),
    ("norm_position", "norm_bias", True),
    ("value_gate", "value_gate", "nope"),
    ("value_gate", "value_residual", "three"),
    ("out_gate", "out_gate", "nope"),
    ("depth", "depth", "nope"),
    ("depth", "plr_key", "nope"),
    ("depth", "depth_blocks", 4),
    ("depth", "depth_block_prior", 1.0),
    ("dense", "dense", "nope"),
    ("dense", "mudd_expand_last", True),
    ("hyper", "hyper", "nope"),
    ("hyper", "hc_streams", 0),
    ("hyper", "hc_sinkhorn_iters", 0),
]


@pytest.mark.parametrize(("name", "field", "value"), BAD, ids=[f"{g}-{f}" for g, f, _ in BAD])
def test_a_bad_value_is_refused_in_one_line_naming_the_field(name, field, value):
    assert field in {f.name for f in dataclasses.fields(GROUPS[name])}
    with pytest.raises(ValueError) as by_config:
        ProbeConfig(**{field: value})
    defaults = ProbeConfig()
    group = GROUPS[name]
    values = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(group)}
    values.update({read: getattr(defaults, read) for read in getattr(group, "reads", ())})
    with pytest.raises(ValueError) as by_group:
        group(**{**values, field: value}).check()  # the group alone refuses it
    for err in (by_config, by_group):
        assert "\n" not in str(err.value)
        assert field in str(err.value)
    assert str(by_config.value) == str(by_group.value)


def test_every_group_has_a_bad_value_case_and_defaults_that_pass():
    assert {name for name, _, _ in BAD} == set(GROUPS)
    for group in GROUPS.values():
        assert callable(group.check)
    ProbeConfig().validate()
