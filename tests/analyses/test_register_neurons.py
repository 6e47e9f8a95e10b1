"""Register neurons: the authors' ranking (golden), a planted register neuron found in a tiny model, and the
test-time register moving its high norm."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from probe.analyses.register_neurons import RegisterOptions, outlier_positions, rank_neurons, window_scores
from probe.hooks import names

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "register_neurons" / "golden.safetensors"


def probe_ranking(acts: torch.Tensor, outputs: torch.Tensor, opts: RegisterOptions):
    """probe's functions over the stored windows, every (layer, neuron) ranked."""
    sums, windows = None, 0
    for a, h in zip(acts, outputs):  # L,T,m and L,T,d
        positions = outlier_positions(h[opts.detect_layer].norm(dim=-1), opts)
        if not len(positions):
            continue
        scores = window_scores(list(a), positions, opts)
        sums = scores if sums is None else [s + x for s, x in zip(sums, scores)]
        windows += 1
    return rank_neurons([s / windows for s in sums], opts)


@pytest.mark.parametrize("case", ["plain", "sparse"])
def test_ranking_matches_the_authors(case):
    golden = load_file(str(GOLDEN))
    acts, outputs = golden["neuron_acts"], golden["layer_outputs"]
    n_all = acts.shape[1] * acts.shape[3]
    opts = RegisterOptions(norm_threshold=30.0, top_k=n_all, sparsity_filter=case == "sparse")
    ours = probe_ranking(acts, outputs, opts)
    assert len(ours) == n_all
    assert ours["layer"].tolist() == golden[f"{case}_layer"].tolist()
    assert ours["neuron"].tolist() == golden[f"{case}_neuron"].tolist()
    assert torch.allclose(torch.tensor(ours["score"].values), golden[f"{case}_score"], rtol=0, atol=1e-12)


def test_highest_layer_and_top_k_cut_the_ranking():
    golden = load_file(str(GOLDEN))
    opts = RegisterOptions(norm_threshold=30.0, highest_layer=1, top_k=3)
    ours = probe_ranking(golden["neuron_acts"], golden["layer_outputs"], opts)
    full = [(l, n) for l, n in zip(golden["plain_layer"].tolist(), golden["plain_neuron"].tolist()) if l <= 1]
    assert list(zip(ours["layer"], ours["neuron"])) == full[:3]
    assert ours["rank"].tolist() == [0, 1, 2]


def test_relative_threshold_marks_the_high_norm_position():
    norms = torch.tensor([50.0, 1.0, 1.2, 0.9, 1.1, 6.0])
    assert outlier_positions(norms, RegisterOptions()).tolist() == [0]  # 10 x median 1.1 = 11
    assert outlier_positions(norms, RegisterOptions(norm_ratio=5.0)).tolist() == [0, 5]
    assert outlier_positions(norms, RegisterOptions(norm_ratio=5.0, sink_position=True)).tolist() == [0]


PLANTED = 5  # the planted register neuron of layer 0


def planted_model():
    """A tiny SwiGLU model whose layer-0 neuron PLANTED fires only on token 0 (along residual direction 0, which no
    other token and no attention output holds) and writes a large norm; windows put token 0 at position 0 only."""
    from tests.support.analyses import tiny

    model = tiny("baseline")
    with torch.no_grad():
        model.embed.weight[:, 0] = 0
        model.embed.weight[0] = 0
        model.embed.weight[0, 0] = 10.0
        for block in model.blocks:
            block.attn.o_proj.weight[0] = 0  # attention never writes direction 0
            block.mlp.gate.weight[:, 0] = 0  # and no neuron reads it ...
            block.mlp.up.weight[:, 0] = 0
        mlp = model.blocks[0].mlp
        mlp.gate.weight[PLANTED] = 0  # ... but PLANTED, which reads only it
        mlp.up.weight[PLANTED] = 0
        mlp.gate.weight[PLANTED, 0] = 1.0
        mlp.up.weight[PLANTED, 0] = 1.0
        mlp.down.weight[:, PLANTED] = 0
        mlp.down.weight[1, PLANTED] = 5.0  # direction 1: the high norm it writes
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 97, (2, 3, 17), generator=g)
    tokens[..., 0] = 0
    return model, tokens


def test_the_planted_neuron_is_the_top_register_neuron():
    from probe.analyses.register_neurons import register_neurons

    model, tokens = planted_model()
    out = register_neurons(model, tokens, RegisterOptions(top_k=3))
    meta = out["meta"].iloc[0]
    assert meta["n_with_outliers"] == meta["n_windows"] == 6 and meta["outlier_pos0_share"] == 1.0
    top = out["neurons"].iloc[0]
    assert (top["layer"], top["neuron"]) == (0, PLANTED)
    assert top["score"] > 5 * out["neurons"].iloc[1]["score"]


def last_norms(model, ids, hooks=()):
    got = {}
    name = names.resid(model.probe_info.n_layers - 1, "post")

    def keep(x, hook):
        got["h"] = x.norm(dim=-1)  # B,T

    with torch.no_grad():
        model.run_with_hooks(ids, fwd_hooks=[*hooks, (name, keep)])
    return got["h"]


@pytest.mark.parametrize("at", ["start", "end"])
def test_the_register_takes_the_high_norm(at):
    from probe.analyses.interventions import TestTimeRegister

    model, tokens = planted_model()
    ids = tokens[0, :, :-1]
    clean = last_norms(model, ids)
    assert (clean[:, 0] > 5 * clean[:, 1:].max(1).values).all()  # the planted outlier at position 0
    edit = TestTimeRegister(((0, PLANTED),), at)
    from probe.analyses.interventions import Ablation

    moved = last_norms(model, edit.extend(ids), edit.hooks(model, Ablation(edit)))
    T = ids.shape[1]
    text, register = moved[:, edit.text_slice(T)], moved[:, edit.register_index(T)]
    assert (register > 5 * text.max(1).values).all()  # the high norm left the text for the register
    assert (text[:, 0] < clean[:, 0] / 5).all()
    alone = TestTimeRegister((), at)
    kept = last_norms(model, alone.extend(ids), alone.hooks(model, Ablation(alone)))
    assert (kept[:, alone.text_slice(T)][:, 0] > 5 * kept[:, alone.register_index(T)]).all()  # token alone: no move


def test_ablate_reports_the_register_and_its_control():
    from probe.analyses.ablate import AblationError, ablate

    model, tokens = planted_model()
    res = ablate(model, tokens, ["register"], progress=False, register_at=("start", "end"))["results"]
    meta_neurons = res.attrs["meta"]["register_neurons"].split()
    assert meta_neurons[0] == f"0:{PLANTED}" and len(meta_neurons) == 10
    rows = res.set_index("setting")
    assert list(rows.index) == ["10 neurons,at=start", "10 neurons,at=end", "token only,at=start", "token only,at=end"]
    assert (rows["scope"] == "model").all() and rows["pos0_share_clean"].nunique() == 1
    # a token after the text is seen by no text query of a causal LM: alone it changes nothing
    alone = rows.loc["token only,at=end"]
    assert abs(alone["delta"]) < 1e-5 and abs(alone["pos0_share_ablated"] - alone["pos0_share_clean"]) < 1e-6
    assert rows.loc[["10 neurons,at=end", "token only,at=end"], "register_share"].eq(0).all()
    assert rows.loc["10 neurons,at=start", "register_share"] > 0
    with pytest.raises(AblationError, match="past the context 64 .* at most 63 tokens"):
        ablate(model, torch.zeros(1, 65, dtype=torch.long), ["register"], progress=False, register_neurons=((0, 1),))


def test_the_cli_moves_named_neurons_and_sinks_lists_them(tmp_path, capsys):
    import pandas as pd

    from probe.cli import main
    from tests.support.cli import WINDOWS, assert_one_line_error

    code = main(
        ["ablate", "--model", "probe/tiny-baseline", *WINDOWS, "--register-neurons", "0:1", "1:2"]
        + ["--register-at", "end", "--out", str(tmp_path / "ab"), "--quiet"]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    res = pd.read_csv(tmp_path / "ab" / "ablate_results.csv")
    assert res["setting"].tolist() == ["2 neurons,at=end", "token only,at=end"]
    assert "register_share" in out.out
    sinks = ["sinks", "--model", "probe/tiny-baseline", *WINDOWS, "--register-neurons", "3"]
    code = main([*sinks, "--quiet"])  # a random tiny model: no position ten times the median norm
    assert_one_line_error(subprocess.CompletedProcess([], code, *capsys.readouterr()), "--register-norm-ratio")
    code = main([*sinks, "--register-norm-ratio", "1.2", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    top = pd.DataFrame(json.loads(out.out)["tables"]["register_neurons"])
    assert top["rank"].tolist() == [0, 1, 2] and top["score"].is_monotonic_decreasing
    code = main([*sinks, "--register-at-sink", "--json"])  # position 0 in every window, whatever the norms
    out = capsys.readouterr()
    assert code == 0, out.err
    assert len(json.loads(out.out)["tables"]["register_neurons"]) == 3
    code = main(["ablate", "--register-neurons", "1-2"])
    r = subprocess.CompletedProcess([], code, *capsys.readouterr())
    assert_one_line_error(r, "expected layer:neuron", "got '1-2'")


def test_hf_adapters_take_the_register_and_experts_are_refused():
    from probe.analyses.ablate import AblationError, ablate
    from probe.checkpoints.interop import wrap
    from probe.checkpoints.tiny import tiny_model

    tokens = torch.randint(0, 96, (1, 2, 13), generator=torch.Generator().manual_seed(0))
    llama = wrap(tiny_model("llama"))
    res = ablate(llama, tokens, ["register"], progress=False, register_at=("end",), register_neurons=((0, 1), (1, 2)))
    rows = res["results"].set_index("setting")
    assert abs(rows.loc["token only,at=end", "delta"]) < 1e-5  # seen by no text query
    assert rows.loc["2 neurons,at=end", "delta"] != 0 and rows["register_share"].eq(0).all()
    with pytest.raises(AblationError, match=r"has no blocks\.0\.mlp\.hook_post .*mixture of experts"):
        ablate(wrap(tiny_model("gpt_oss")), tokens, ["register"], progress=False, register_neurons=((0, 1),))


def test_bad_register_settings_are_one_line():
    from probe.analyses.ablate import AblationError
    from probe.analyses.interventions import TestTimeRegister
    from tests.support.analyses import tiny

    info = tiny("baseline").probe_info
    with pytest.raises(AblationError, match="unknown register place 'middle'; choose from start, end"):
        TestTimeRegister(at="middle").check(info)
    with pytest.raises(AblationError, match=r"register neuron \(2, 0\) is not in model .*layers 0..1"):
        TestTimeRegister(((2, 0),)).check(info)


def test_a_neuron_past_the_layers_width_is_one_line_from_the_cli(tmp_path, capsys):
    """--register-neurons 1:99999 was an IndexError reported as an internal error (exit 1)."""
    from probe.cli.main import main

    code = main(
        [
            "ablate",
            "--model",
            "probe/tiny-baseline",
            "--register-neurons",
            "1:99999",
            "--batches",
            "1",
            "--batch-size",
            "1",
            "--ctx",
            "16",
            "--quiet",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "register neuron (1, 99999) is not in model" in err and "layer 1's MLP has neurons 0.." in err
    assert not (tmp_path / "out").exists()
