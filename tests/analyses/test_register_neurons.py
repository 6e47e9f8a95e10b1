"""Register neurons: the authors' ranking (golden), a planted register neuron found in a tiny model, and the
test-time register moving its high norm."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from probe.analyses.register_neurons import RegisterOptions, outlier_positions, rank_neurons, window_scores

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
