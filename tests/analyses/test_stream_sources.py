"""Stream sources (probe.analyses.streams, docs/definitions.md#stream-sources) on tiny hyper-connected models: the
composed sources rebuild every read from the embedding and the sub-layers' outputs, they sum to the read mass of its
own recursion, one stream at init is the plain residual, the distances and the usage entropy by hand, the BOS outlier
found in the stream it was put in, and the same on a tiny DeepSeek-V4 through its adapter."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

from probe.analyses.streams import (
    StreamAccumulator,
    composed_sources,
    identity_distance,
    nearest_permutation,
    permutation_distance,
    read_mass,
    stream_sources,
    usage_entropy,
)
from probe.hooks import names
from tests.support.analyses import tiny, windows

LONG_RATES = {"compress_rates": {"compressed_sparse_attention": 16, "heavily_compressed_attention": 32}}


def randomised(variant: str, n: int = 4, seed: int = 0, **over):
    """A tiny hyper-connected model whose mixing parameters are drawn at random (static HC: H_pre, H_post, H_res
    themselves; mHC: the biases of its logits), so no structure of the init is assumed."""
    model = tiny(variant, hc_streams=n, **over)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.split(".")[-1] in ("static_pre", "static_post", "static_res", "bias") and ".hc_" in name:
                p.copy_(torch.randn(p.shape, generator=g))
    return model


def rebuilt_reads(cache, n_layers: int):
    """(read from the hooks, read rebuilt from the composed sources) per read site, each (B,T,d)."""
    embed = cache[names.streams(0)][:, :, 0]  # every stream starts as the embedding
    outputs, pres, posts, ress, reads = [], [], [], [], []
    for l in range(n_layers):
        for site, point in zip(names.HC_SITES, names.STREAM_POINTS):  # attention reads the block's input, MLP mid
            pre = cache[names.hc(l, site, "pre")]
            pres.append(pre)
            posts.append(cache[names.hc(l, site, "post")])
            ress.append(cache[names.hc(l, site, "res")])
            reads.append(torch.einsum("btj,btjd->btd", pre.double(), cache[names.streams(l, point)].double()))
            outputs.append(cache[names.sublayer_out(l, site)])
    rebuilt = []
    for c in composed_sources(pres, posts, ress):
        sources = [embed, *outputs[: c.shape[-1] - 1]]
        rebuilt.append(sum(c[..., s, None] * x.double() for s, x in enumerate(sources)))
    return reads, rebuilt


@pytest.mark.parametrize("variant", ["hc", "hc-dynamic", "mhc"])
def test_the_composed_sources_rebuild_every_read(variant):
    model = randomised(variant).double()
    _, cache = model.run_with_cache(windows(1, 2, 10)[0, :, :-1])
    reads, rebuilt = rebuilt_reads(cache, model.probe_info.n_layers)
    for k, (read, again) in enumerate(zip(reads, rebuilt)):
        assert (read - again).abs().max() <= 1e-10 * read.abs().max(), k


def test_the_sources_sum_to_the_read_mass():
    g = torch.Generator().manual_seed(0)
    shape = (2, 3, 4)  # B,T,n
    pres, posts = ([torch.randn(shape, generator=g) for _ in range(5)] for _ in range(2))
    ress = [torch.randn(*shape, 4, generator=g) for _ in range(5)]
    head = torch.rand(shape, generator=g)
    sums = [c.sum(-1) for c in composed_sources(pres, posts, ress, head)]
    for k, (total, mass) in enumerate(zip(sums, read_mass(pres, posts, ress, head))):
        assert torch.allclose(total, mass, rtol=1e-12, atol=1e-12), k
    result = stream_sources(randomised("mhc"), windows(1, 2, 10))
    heat = result["heatmap"].set_index("site").drop(columns=["model", "corpus"])
    assert heat.sum(axis=1).to_numpy() == pytest.approx(result["sites"]["read_mass"].to_numpy(), rel=1e-12)


def test_one_stream_at_init_is_the_plain_residual():
    """n = 1, H_pre = H_post = H_res = 1: every read draws 1 from the embedding and each earlier sub-layer."""
    result = stream_sources(tiny("hc", hc_streams=1), windows(1, 2, 10))
    sites, heat = result["sites"], result["heatmap"].drop(columns=["model", "corpus", "site"])
    assert ((heat == 1.0) | heat.isna()).all().all() and heat.notna().sum(axis=1).tolist() == [1, 2, 3, 4, 5]
    assert sites["neff_mean"].to_numpy() == pytest.approx(sites["n_sources"].to_numpy(), rel=1e-12)
    assert (sites["read_mass"] == sites["n_sources"]).all() and sites["usage_entropy"].isna().all()
    connections = sites.iloc[:-1]  # the final read mixes nothing
    assert (connections[["identity_distance", "permutation_distance"]] == 0).all().all()


def test_static_hc_at_init_reads_one_stream_and_keeps_every_stream():
    result = stream_sources(tiny("hc", hc_streams=4), windows(1, 2, 10))
    connections = result["sites"].iloc[:-1]
    assert (connections[["identity_distance", "identity_distance_max", "permutation_distance"]] == 0).all().all()
    assert (connections["usage_entropy"] == 0).all()  # a one-hot read
    assert result["sites"]["usage_entropy"].iloc[-1] == pytest.approx(1.0)  # the head sums the streams alike
    weights = result["stream_weights"]
    for k, site in enumerate(connections["site_index"]):  # sub-layer k reads stream k mod n, writes 1 to each
        rows = weights[weights["site_index"] == site]
        assert rows["read_weight"].tolist() == [float(j == k % 4) for j in range(4)]
        assert (rows["write_weight"] == 1).all()


def test_the_distances_by_hand():
    for n in (1, 2, 3, 5):
        eye = torch.eye(n)
        assert identity_distance(eye) == 0 and permutation_distance(eye) == 0
        uniform = torch.full((n, n), 1 / n)  # every permutation is as near: √(n − 1) from each, the identity too
        assert float(identity_distance(uniform)) == pytest.approx(math.sqrt(n - 1), abs=1e-12)
        assert float(permutation_distance(uniform)) == pytest.approx(math.sqrt(n - 1), abs=1e-12)
    swap = torch.eye(4)[[1, 0, 2, 3]]  # two streams swapped: 4 entries off the identity by 1
    assert float(identity_distance(swap)) == pytest.approx(2.0) and float(permutation_distance(swap)) == 0
    g = torch.Generator().manual_seed(1)
    for perm in itertools.islice(itertools.permutations(range(5)), 0, 120, 17):
        p = torch.eye(5)[list(perm)]
        noisy = p + 0.05 * torch.rand(5, 5, generator=g)
        assert torch.equal(nearest_permutation(noisy), p.double())


def test_the_nearest_permutation_maximises_the_overlap():
    """Against every permutation scored one by one, on random matrices of several shapes at once."""
    g = torch.Generator().manual_seed(2)
    res = torch.rand(3, 2, 4, 4, generator=g)
    best = nearest_permutation(res)
    for index in itertools.product(range(3), range(2)):
        scores = [sum(float(res[index][i, p[i]]) for i in range(4)) for p in itertools.permutations(range(4))]
        assert float((res[index] * best[index]).sum()) == pytest.approx(max(scores), abs=1e-12)
    try:
        import scipy  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match=r"^7 streams: .*scipy") as e:
            nearest_permutation(torch.rand(7, 7, generator=g))
        assert "\n" not in str(e.value)


def test_usage_entropy_by_hand():
    assert float(usage_entropy(torch.full((4,), 0.3))) == pytest.approx(1.0, abs=1e-12)
    assert float(usage_entropy(torch.tensor([0.0, -2.0, 0.0]))) == 0.0
    two = usage_entropy(torch.tensor([1.0, 3.0]))  # shares 1/4, 3/4 over log 2
    assert float(two) == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)) / math.log(2), abs=1e-12)
    assert usage_entropy(torch.ones(2, 1)).isnan().all()


def test_mhc_mixes_with_doubly_stochastic_rows_and_reads_every_stream():
    result = stream_sources(randomised("mhc"), windows(1, 2, 10))
    rows = result["stream_mixing"].groupby(["site_index", "out_stream"])["weight"].sum()
    assert rows.to_numpy() == pytest.approx(1.0, abs=1e-5)  # Sinkhorn's last step normalises H_res's rows
    assert (result["stream_weights"]["read_weight"] > 0).all()


def test_the_bos_outlier_is_found_in_its_stream():
    """1000 put at position 0 of stream 2 in block 1's input: that stream holds it, pos0_top by hand."""
    model = randomised("mhc")

    def outlier(streams, hook):
        streams = streams.clone()
        streams[:, 0, 2, 3] = 1e3
        return streams

    model.add_hook(names.streams(1), outlier, is_permanent=True)
    data = windows(2, 2, 10)
    result = stream_sources(model, data)
    s = result["summary"].iloc[0]
    assert (s["bos_layer"], s["bos_stream"]) == (1, 2) and s["bos_ratio"] > 10
    row = result["stream_massive"].set_index(["layer", "stream"]).loc[(1, 2)]
    assert row["pos0_top"] == 1e3 and row["bos_share"] == 1.0
    _, cache = model.run_with_cache(data[0, :, :-1])
    top = cache[names.streams(1)][:, 1:, 0].abs().amax((1, 2))  # stream 0 elsewhere, per window of batch 0
    acc = StreamAccumulator(2, 4, head=False)
    acc.add_streams(1, cache[names.streams(1)])
    assert float(acc.rest[1, 0]) == pytest.approx(float(top.double().sum()), rel=1e-12)


def test_a_model_without_streams_is_refused_in_one_line():
    with pytest.raises(ValueError, match="has no hyper-connected streams") as e:
        stream_sources(tiny("baseline"), windows(1, 2, 10))
    assert "\n" not in str(e.value)


def test_deepseek_v4_through_its_adapter():
    """transformers' tiny DeepSeek-V4 (compress rates above the windows, as its adapter's tests run it): the reads
    are rebuilt, its H_res rows sum to 1, and the head's collapse is the final read (hc_head.hook_pre)."""
    from probe.checkpoints.adapters import adapt
    from probe.checkpoints.tiny import tiny_model

    ref = tiny_model("deepseek_v4", overrides=LONG_RATES)
    data = windows(1, 2, 8, vocab=ref.config.vocab_size)
    m64 = adapt(copy.deepcopy(ref).to(torch.float64))
    with torch.no_grad():
        _, cache = m64.run_with_cache(data[0, :, :-1])
    reads, rebuilt = rebuilt_reads(cache, m64.probe_info.n_layers)
    for k, (read, again) in enumerate(zip(reads, rebuilt)):
        assert (read - again).abs().max() <= 1e-10 * read.abs().max(), k
    result = stream_sources(adapt(ref), data)
    sites = [names.read_site(l, s) for l in range(2) for s in ("attn", "mlp")]
    assert result["sites"]["site"].tolist() == sites + [names.FINAL_READ]
    rows = result["stream_mixing"].groupby(["site_index", "out_stream"])["weight"].sum()
    assert rows.to_numpy() == pytest.approx(1.0, abs=1e-5)
