"""Every version of LR-AttnRes's model.py a checkpoint can come from, loaded as that version computed it.

tests/fixtures/authors/lr-attnres-versions/ (scripts/authors/lr_attnres_versions.py) holds, for every commit of
jon123boss/LR-AttnRes from 092e6da to 14784c7 that changed model.py or attnres_ops.py, its ModelConfig fields (read
from the dataclass), and for a grid of cases (plain, AttnRes and P-LR / S-LR, full and block, the block mean, sqrt
mean, log-count prior, fixed and learned powers) the model_args their code wrote, the weights and their fp64 logits.
A case's fields the commit lacks are dropped, so each run's model_args are what that commit's checkpoint holds. Here
probe's loader reads each run's model_args and weights (no authors' code) and must give that commit's logits.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from probe.checkpoints import lr_attnres
from probe.checkpoints.muddformer import AuthorsFormatError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "authors" / "lr-attnres-versions"
FP64_TOL = 1e-10
PRIOR_ONLY_COMMIT = "0f5cf7e"  # the prior without its field (16 minutes): read as the code before it


@cache
def fixture():
    meta = json.loads((FIXTURE / "meta.json").read_text())
    return meta, load_file(FIXTURE / "weights.safetensors"), load_file(FIXTURE / "outputs.safetensors")


def commits() -> list[dict]:
    return [c for c in fixture()[0]["commits"] if "defaults" in c]  # 0c4f10e (liger kernels) does not import


def fields_at(index: int) -> set[str]:
    """The ModelConfig fields of commit ``index`` of meta["commits"], from the first commit's and each change."""
    fields = set()
    for c in fixture()[0]["commits"][: index + 1]:
        fields = set(c.get("fields", fields)) | set(c.get("fields_added", {}))
        fields -= set(c.get("fields_removed", []))
    return fields


def run_args(commit: dict, run: dict) -> dict:
    return {**fixture()[0]["defaults"][commit["defaults"]], **run["model_args"]}


def run_weights(run: dict) -> dict:
    prefix = run["weights"] + "/"
    return {k[len(prefix) :]: v for k, v in fixture()[1].items() if k.startswith(prefix)}


def prior_matters(case: str) -> bool:
    return "block" in case


@pytest.mark.parametrize("commit", [c["commit"][:7] for c in commits()])
def test_every_version_loads_as_its_code_computed(commit):
    meta, _, outputs = fixture()
    ids = load_file(FIXTURE / "inputs.safetensors")["input_ids"]
    c = next(c for c in commits() if c["commit"].startswith(commit))
    checked = 0
    for case, run in meta["runs"][c["commit"]].items():
        if "model_args" not in run:
            continue
        model = lr_attnres.from_payload(
            {"model": run_weights(run), "model_args": run_args(c, run)}, case, torch.float64
        )
        assert model.config.rope_table == "stored"  # their RoPE buffers, read from the weights
        with torch.no_grad():
            diff = (model(ids).logits - outputs[run["logits"]]).abs().max().item()
        if commit == PRIOR_ONLY_COMMIT and prior_matters(case):
            assert diff > 1e-2, (case, diff)  # the one version whose prior its fields do not show
        else:
            assert diff <= FP64_TOL, (case, diff)
        checked += 1
    assert checked >= 7


def test_the_version_table_is_their_history():
    """probe's FIELD_VERSIONS are the fields each commit of their history added, in order, and every field probe
    knows but those is one the first version has: read from the fixture's ModelConfig per commit."""
    meta = fixture()[0]
    added = {c["commit"][:7]: set(c.get("fields_added", {})) for c in meta["commits"]}
    removed = {f for c in meta["commits"] for f in c.get("fields_removed", [])}
    history = [(k, v) for k, v in added.items() if v and not v <= removed]  # 0c4f10e's liger fields: gone at 1c3c76d
    assert [(commit, set(fields)) for commit, _, fields in lr_attnres.FIELD_VERSIONS] == history
    known = lr_attnres.MAPPED_FIELDS | lr_attnres.EXECUTION_FIELDS | set(lr_attnres.REQUIRED) | lr_attnres.INERT_FIELDS
    later = {f for _, _, fields in lr_attnres.FIELD_VERSIONS for f in fields}
    assert known - later == set(meta["commits"][0]["fields"])
    assert known == fields_at(len(meta["commits"]) - 1)
    assert (lr_attnres.FIRST[0], lr_attnres.LAST[0]) == (meta["first"][:7], meta["last"][:7])
    assert set(lr_attnres.ABSENT) == later


def test_each_checkpoint_records_the_code_version_it_implies():
    """The recorded range holds the commit that wrote the model_args; every absent field is listed as assumed."""
    meta = fixture()[0]
    order = [c["commit"][:7] for c in meta["commits"]]
    for i, c in enumerate(meta["commits"]):
        run = meta["runs"].get(c["commit"], {}).get("plr-block-mean")
        if not run:
            continue
        args, record = lr_attnres.code_version(run_args(c, run))
        since, _, rest = record["code"].partition(" (")
        since = since.split()[-1]
        until = rest.split("before ")[-1].split()[0] if "before" in rest else None
        assert order.index(since) <= i and (until is None or i < order.index(until)), (c["commit"][:7], record)
        assert set(record.get("assumed", {})) == set(lr_attnres.ABSENT) - fields_at(i)
        if "attnres_block_count_prior" not in fields_at(i):
            assert (
                args["attnres_block_count_prior"] is False
                and "0f5cf7e" in record["assumed"]["attnres_block_count_prior"]
            )


def test_a_run_some_version_refuses_loads_as_the_versions_that_ran_it():
    """Block sums with the log-count prior: their __post_init__ refused it at 0c2bb70 and 97ced22, but 65c65f4..e354c3c
    (the same fields) and 7dbb9be on ran it, to the same logits; probe loads it as they computed it."""
    meta = fixture()[0]
    outcome = {c["commit"][:7]: meta["runs"][c["commit"]]["plr-block-sum-prior"] for c in commits()[7:]}
    assert "error" in outcome["0c2bb70"] and "error" in outcome["97ced22"]
    assert outcome["65c65f4"]["logits"] == outcome["e354c3c"]["logits"] == outcome["14784c7"]["logits"]


@pytest.mark.parametrize(
    "version, edit, says",
    [
        (1, {"liger_rms_norm": False}, "'liger_rms_norm' is in none of the versions"),
        (1, {"norm_pos": None}, "lack 'norm_pos', which every version"),
        (1, {"attnres_block_alpha": "legacy"}, "no version of their ModelConfig has these fields"),
        (-1, {"attnres_block_average_mode": "cube"}, "attnres_block_average_mode='cube'"),
    ],
)
def test_model_args_no_version_wrote_are_one_line(version, edit, says):
    """A field no version has (0c4f10e's liger kernels), a base field missing, a later version's field without an
    earlier one's (7dbb9be's powers on 1c3c76d's fields), a value no version accepts."""
    c = commits()[version]
    args = run_args(c, fixture()[0]["runs"][c["commit"]]["plr-block-mean"]) | edit
    args = {k: v for k, v in args.items() if v is not None or k not in edit}
    with pytest.raises(AuthorsFormatError) as e:
        lr_attnres.probe_config_kwargs(args, 1e-7, "ckpt")
    assert says in str(e.value) and "\n" not in str(e.value)
