"""docs/how-to/adding-an-intervention.md followed for real: its two code blocks, taken from the page, are applied to
a clean copy of the tree (tests/docs/guides.py), which then differs from the package in exactly the new file and the
one import line. ``probe ablate --ablate vscale`` runs from the copy as a user runs it, and its loss change is
recomputed by hand on the same windows with a plain PyTorch forward hook on each layer's value projection (no probe
hook): a guide whose edit, scope or registration is wrong fails here."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.docs.guides import Guide, apply, clean_copy, in_copy, snapshot, touched

PAGE = "how-to/adding-an-intervention.md"
TWO = ["probe/analyses/interventions/__init__.py", "probe/analyses/interventions/vscale.py"]
PINS = "tests/cli/parser_actions"
FLAGS = ["--model", "probe/bb-baseline", "--batches", "2", "--batch-size", "2", "--ctx", "32"]

# The page's two blocks as this test expects them (tests/docs/test_code_blocks.py: a snippet's names and strings occur
# in the test that runs it); the test runs the page's own blocks and checks they are these.
VSCALE = r'''"""Value scale: position 0's value read multiplied by a factor (a toy intervention)."""

from dataclasses import dataclass

from probe.analyses.interventions.base import (
    AblationError,
    Intervention,
    layers_of,
    local_conditions,
    register_intervention,
)
from probe.hooks import names


@register_intervention("vscale")
@dataclass(frozen=True)
class ValueScale(Intervention):
    """v_0 at hook_v times ``factor`` in the heads of the condition (a value gate sees the scaled read)."""

    factor: float = 0.5

    @property
    def label(self) -> str:
        return f"x{self.factor:g}"

    def check(self, info) -> None:
        if not 0 <= self.factor <= 1:
            raise AblationError(f"value scale factor must be in 0..1, got {self.factor!r}")

    def hooks(self, model, where, mech=None, gate_means=None) -> list:
        heads = slice(None) if where.head is None else slice(where.head, where.head + 1)

        def scale(v, hook):  # B, T, Hkv, dv
            v = v.clone()
            v[:, 0, heads] = v[:, 0, heads] * self.factor
            return v

        return [(names.attn(layer, "v"), scale) for layer in layers_of(where, model.probe_info)]

    @classmethod
    def conditions(cls, model, mech, opts) -> list:
        info = model.probe_info
        edit = cls()
        edit.check(info)
        return local_conditions(info, edit, opts, info.n_kv_heads)
'''
INIT = r"""from probe.analyses.interventions.vscale import ValueScale  # noqa: E402
"""

# in the copy, one interpreter: the verb as `probe ablate --ablate vscale ... --out OUT`, then the loss change by
# hand: position 0's row of every layer's v_proj output (all KV heads) times 0.5, by a torch forward hook
SCRIPT = r"""
import contextlib, io, json, runpy, sys

import torch
import torch.nn.functional as F

from probe.cli import main
from probe.cli.main import build_parser
from probe.cli.prepare import prepare

out, flags = sys.argv[1], sys.argv[2:]
sys.argv = ["tests/cli/test_parser_actions.py", "--write", "ablate"]
with contextlib.redirect_stdout(io.StringIO()):
    runpy.run_path("tests/cli/test_parser_actions.py", run_name="__main__")  # python tests/cli/... --write ablate
text = io.StringIO()
with contextlib.redirect_stdout(text):
    code = main(["ablate", "--ablate", "vscale", "--no-per-layer", *flags, "--out", out, "--quiet"])
assert code == 0, code

run = prepare(build_parser().parse_args(["ablate", *flags, "--quiet"]), "probe/bb-baseline", "by hand")
model = run.model


def half_first_row(module, inputs, output):  # B, T, Hkv*dv
    output = output.clone()
    output[:, 0] = output[:, 0] * 0.5
    return output


def losses(batch):
    logits = model(batch[:, :-1]).logits  # B, T, V
    return F.cross_entropy(logits.flatten(0, 1).double(), batch[:, 1:].flatten(), reduction="mean").item()


deltas = []
with torch.no_grad():
    for batch in run.windows.tokens:  # N, B, T+1
        clean = losses(batch)
        handles = [block.attn.v_proj.register_forward_hook(half_first_row) for block in model.blocks]
        try:
            deltas.append(losses(batch) - clean)
        finally:
            for h in handles:
                h.remove()
print(json.dumps({"text": text.getvalue(), "deltas": deltas}))
"""


@pytest.fixture(scope="module")
def followed(tmp_path_factory):
    """(files steps 1-2 touched, the guide, the run's results table, the by-hand per-batch deltas, files step 3
    touched)."""
    guide = Guide(PAGE)
    root = clean_copy(tmp_path_factory.mktemp("tree"), guide, extra=("tests/cli/test_parser_actions.py", PINS))
    start = snapshot(root)
    apply(root, guide)
    two = snapshot(root)
    out = tmp_path_factory.mktemp("out")
    r = in_copy(root, "-c", SCRIPT, out, *FLAGS)
    assert r.returncode == 0, r.stderr[-3000:]
    done = json.loads(r.stdout.strip().splitlines()[-1])
    pins = [f for f in touched(two, snapshot(root)) if f.startswith(PINS)]
    return touched(start, two), guide, pd.read_csv(out / "ablate_results.csv"), done["deltas"], pins


def test_the_page_shows_the_blocks_this_test_expects():
    assert Guide(PAGE).files == {TWO[1]: VSCALE, TWO[0]: INIT}


def test_the_guide_is_one_new_file_one_line_and_the_verbs_pin(followed):
    files, guide, *_, pins = followed
    assert files == guide.touches() == TWO
    assert guide.files[TWO[0]].strip().count("\n") == 0  # the import: one line
    assert pins == [f"{PINS}/ablate.json"]  # --ablate's choices: the pin command rewrites this verb's pin only


def test_the_loss_change_is_the_edit_made_by_hand(followed):
    _, _, results, deltas, _ = followed
    row = results[results["intervention"] == "vscale"]
    assert len(row) == 1 and row["setting"].iloc[0] == "x0.5" and row["scope"].iloc[0] == "model"
    assert len(deltas) == 2 and abs(deltas[0] - deltas[1]) > 0  # two batches, each its own change
    assert row["delta"].iloc[0] == pytest.approx(sum(deltas) / len(deltas), abs=1e-5)
    assert abs(row["delta"].iloc[0]) > 1e-4  # the edit moves the loss: a hook that did nothing would fail above
