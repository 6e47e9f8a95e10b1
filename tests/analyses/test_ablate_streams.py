"""Depth forcings of hyper-connections (`probe ablate --ablate depth` on static and dynamic HC, mHC and DeepSeek-V4;
docs/definitions.md#ablations), on models saved to a folder and loaded back: forced to the residual at every
connection, a hyper-connected model is the plain transformer with the same sub-layers; forced at every connection, the
two forcings agree (the streams stay equal copies); one connection's forcing is its three weights set by hand; drop is
refused in one line; the verb end to end."""

from __future__ import annotations

import contextlib
import copy
import io

import pandas as pd
import pytest
import torch

import probe
from probe.analyses.ablate import AblationError, ablate
from probe.cli.main import main
from probe.hooks import names
from tests.analyses.test_ablate import W, losses, row
from tests.analyses.test_stream_sources import LONG_RATES, randomised
from tests.cli.test_sources_streams import VOCAB, text_file
from tests.support.analyses import tiny, windows

VARIANTS = ["hc", "hc-dynamic", "mhc"]


def saved(model, folder):
    """The model as a user has it: saved to ``folder`` and loaded back by probe.load."""
    model.save_pretrained(folder)
    return probe.load(str(folder))


def plain_twin(model):
    """The baseline (no hyper-connections) with ``model``'s every other weight: its embedding, sub-layers and norms."""
    twin = tiny("baseline", hyper="none")
    state = {k: v for k, v in model.state_dict().items() if ".hc_" not in k and not k.startswith("hc_head")}
    missing, unexpected = twin.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return twin.eval()


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_connection_forced_to_the_residual_is_the_plain_transformer(variant, tmp_path):
    """H_pre = 1/n, H_post = 1, H_res = I everywhere: every stream is the plain residual stream, and the head's
    collapse of n equal streams is a multiple of it, which the final RMSNorm undoes (up to its eps)."""
    model = saved(randomised(variant), tmp_path / variant)
    res = ablate(model, W, ["depth"], depth_modes=("uniform", "residual"), per_layer=False, progress=False)
    plain = losses(plain_twin(model), W)
    residual, uniform = row(res, "depth", "residual"), row(res, "depth", "uniform")
    assert residual["loss_ablated"] == pytest.approx(plain, abs=1e-5)  # measured: 1e-6
    assert abs(residual["loss_clean"] - plain) > 1e-3  # the random mixing is not the residual
    # equal streams stay equal under either mix: the two forcings are one model
    assert uniform["loss_ablated"] == pytest.approx(residual["loss_ablated"], abs=1e-6)


@pytest.mark.parametrize("mode", ["uniform", "residual"])
def test_one_connection_forced_equals_its_weights_set_by_hand(mode, tmp_path):
    model = saved(randomised("mhc"), tmp_path / "mhc")
    res = ablate(model, W, ["depth"], depth_modes=(mode,), progress=False)
    sites = [names.block(l) + f".hc_{s}" for l in range(model.probe_info.n_layers) for s in names.HC_SITES]
    assert res["results"].query("scope == 'site'")["site"].tolist() == sites
    n = model.config.hc_streams
    by_hand = [
        (names.hc(1, "mlp", "pre"), lambda w, hook: torch.full_like(w, 1 / n)),
        (names.hc(1, "mlp", "post"), lambda w, hook: torch.ones_like(w)),
        (
            names.hc(1, "mlp", "res"),
            lambda w, hook: torch.full_like(w, 1 / n) if mode == "uniform" else torch.eye(n).expand_as(w).clone(),
        ),
    ]
    got = row(res, "depth", mode, site="blocks.1.hc_mlp")
    assert got["loss_ablated"] == pytest.approx(losses(model, W, by_hand), abs=1e-6)
    assert abs(got["delta"]) > 1e-5


def test_drop_is_refused_in_one_line_and_a_connection_the_model_lacks_too():
    with pytest.raises(
        AblationError, match="depth forcing 'drop' does not apply to model .*choose from uniform, residual$"
    ) as e:
        ablate(randomised("hc"), W, ["depth"], depth_modes=("drop",), progress=False)
    assert "\n" not in str(e.value)
    with pytest.raises(AblationError, match="'drop' does not apply") as e:  # beside one it takes: not skipped
        ablate(randomised("hc"), W, ["depth"], depth_modes=("residual", "drop"), progress=False)
    assert "\n" not in str(e.value)
    with pytest.raises(AblationError, match="no depth routing .* or hyper-connections"):
        ablate(tiny("baseline"), W, ["depth"], progress=False)


def test_deepseek_v4_through_its_adapter():
    """transformers' tiny DeepSeek-V4: its connections take the forcings through the adapter's hooks, and forced at
    every connection the two agree as for probe's own."""
    from probe.checkpoints.adapters import adapt
    from probe.checkpoints.tiny import tiny_model

    ref = tiny_model("deepseek_v4", overrides=LONG_RATES)
    model = adapt(copy.deepcopy(ref))
    data = windows(2, 2, 8, vocab=ref.config.vocab_size)
    res = ablate(model, data, ["depth"], depth_modes=("uniform", "residual"), progress=False)
    whole = res["results"].query("scope == 'model'").set_index("setting")["loss_ablated"]
    assert whole["uniform"] == pytest.approx(whole["residual"], abs=1e-5)
    sites = res["results"].query("scope == 'site'")
    assert set(sites["site"]) == {f"blocks.{l}.hc_{s}" for l in range(2) for s in names.HC_SITES}
    assert (sites["delta"].abs() > 0).all()


def test_the_verb_on_a_saved_mhc_model(tmp_path):
    randomised("mhc", vocab_size=VOCAB).save_pretrained(tmp_path / "mhc")
    args = ["--model", tmp_path / "mhc", "--data", text_file(tmp_path), "--ablate", "depth", "--out", tmp_path / "out"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["ablate", *map(str, args), "--batches", "1", "--batch-size", "2", "--ctx", "16", "--quiet"])
    assert code == 0, err.getvalue()
    table = pd.read_csv(tmp_path / "out" / "ablate_results.csv")
    assert set(table["setting"]) == {"uniform", "residual"}
    assert set(table.query("scope == 'site'")["site"]) == {
        f"blocks.{l}.hc_{s}" for l in range(2) for s in ("attn", "mlp")
    }
