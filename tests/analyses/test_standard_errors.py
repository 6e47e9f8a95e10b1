"""Standard errors over evaluation batches where the analyses report pooled means or ratios
(docs/definitions.md#batch-standard-errors, docs/definitions.md#jackknife): the delete-one jackknife helper, the
exposure shares (s.e. of per-batch means), the gates' token-identity share and Sink^eps (jackknife: each statistic
recomputed with one batch left out, checked against running the analysis on the windows without that batch), and the
pages and figures that show them."""

import math

import numpy as np
import pandas as pd
import pytest

from probe.analyses.gates import gate_stats
from probe.analyses.inject import exposure_stats
from probe.analyses.sink_heads import sink_heads
from probe.analyses.stats import jackknife_se
from probe.present.gates import gate_figure, gate_sections
from probe.present.inject import exposure_figure, inject_sections
from probe.present.sink_eps import sink_eps_figure, sink_eps_trend_figure
from probe.present.sinks import sink_sections
from tests.support.analyses import tiny, windows

N_BATCHES = 3


def without(toks, i):
    """The windows with batch i left out."""
    return toks[[j for j in range(len(toks)) if j != i]]


def jackknife_formula(theta) -> np.ndarray:
    """s.e. = sqrt((n-1)/n Σ_i (θ_-i - mean θ_-·)²), written out independently of the helper."""
    theta = np.asarray(theta, dtype=float)
    n = len(theta)
    return np.sqrt((n - 1) / n * ((theta - theta.mean(0)) ** 2).sum(0))


# ------------------------------------------------------------------------------------------------------------ helper


def test_jackknife_of_a_mean_is_the_sem_of_batch_means():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 7))  # 5 equal batches of 7 values
    means = x.mean(1)
    loo = [(x.sum() - x[i].sum()) / (x.size - x.shape[1]) for i in range(5)]  # the mean with batch i left out
    assert jackknife_se(loo) == pytest.approx(means.std(ddof=1) / math.sqrt(5), rel=1e-12)
    assert jackknife_se(np.array(loo)[:, None].repeat(2, 1)).shape == (2,)  # per entry along axis 0
    assert math.isnan(jackknife_se(loo[:1]))  # one batch: no standard error


def test_jackknife_of_a_ratio_on_a_hand_made_example():
    a, b = np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 4.0])  # statistic Σa / Σb = 6/8
    loo = [(a.sum() - a[i]) / (b.sum() - b[i]) for i in range(3)]  # 5/6, 4/6, 3/4
    assert loo == pytest.approx([5 / 6, 4 / 6, 3 / 4])
    assert jackknife_se(loo) == pytest.approx(math.sqrt(2 / 3 * 2 / 144))  # = sqrt(1/108) = 0.0962


# ------------------------------------------------------------------------------------------------------------ exposure


def test_exposure_se_is_the_sem_of_per_batch_shares():
    model, toks = tiny("sinklogit"), windows(N_BATCHES, 2, 12)
    cutoffs = ["q25", "median"]
    full = exposure_stats(model, toks, cutoffs=cutoffs)
    each = [exposure_stats(model, toks[i : i + 1], cutoffs=cutoffs) for i in range(N_BATCHES)]  # one batch alone
    for table, keys in (("exposure", ["cutoff"]), ("exposure_layers", ["cutoff", "layer"])):
        got = full[table].set_index(keys)
        per_batch = pd.concat([e[table] for e in each]).groupby(keys)
        for col in ("quiet_share", "phantom_share"):
            assert got[col].to_numpy() == pytest.approx(per_batch[col].mean()[got.index].to_numpy(), rel=1e-9)
            sem = per_batch[col].sem()[got.index].to_numpy()
            assert (sem > 0).all() and got[f"{col}_se"].to_numpy() == pytest.approx(sem, rel=1e-9)
    assert full["exposure"].columns.get_loc("quiet_share_se") == full["exposure"].columns.get_loc("quiet_share") + 1
    assert full["exposure"]["quiet_share_se"].isna().sum() == 0
    assert each[0]["exposure"]["quiet_share_se"].isna().all()  # one batch: NaN, not 0


# ------------------------------------------------------------------------------------------------------------ gates


def brute_token_shares(model, toks, frequent=None) -> np.ndarray:
    """Token-identity share per layer and pooled over layers, (L + 1,), from the cached gates: between-token / total
    sum of squares per KV head, summed over heads (and layers); ``frequent``: only reads of those token ids."""
    between, total = [], []
    for l in range(model.probe_info.n_layers):
        frames = []
        for x in toks:
            # only the gates, as the analysis reads them (caching hook_result would sum the heads' writes in
            # another order: the same forward to fp32 rounding, not bit for bit)
            _, cache = model.run_with_cache(x[:, :-1], names_filter=lambda n: n.endswith("hook_v_gate"))
            g = cache[f"blocks.{l}.attn.hook_v_gate"].double()  # (B, T, Hkv)
            for h in range(g.shape[-1]):
                frames.append(
                    pd.DataFrame({"head": h, "token": x[:, :-1].flatten().numpy(), "g": g[..., h].flatten().numpy()})
                )
        df = pd.concat(frames)
        if frequent is not None:
            df = df[df["token"].isin(frequent)]
        grand = df.groupby("head")["g"].transform("mean")
        by_token = df.groupby(["head", "token"])["g"].transform("mean")
        between.append(float(((by_token - grand) ** 2).sum()))
        total.append(float(((df["g"] - grand) ** 2).sum()))
    between, total = np.array(between), np.array(total)
    return np.append(between / total, between.sum() / total.sum())


def test_token_share_jackknife_leaves_each_batch_out():
    model, toks, min_count = tiny("normgate", n_kv_heads=2), windows(N_BATCHES, 2, 12, vocab=9), 9
    res = gate_stats(model, toks, min_count=min_count)
    values, counts = np.unique(toks[..., :-1].numpy(), return_counts=True)
    frequent = values[counts >= min_count]  # fixed from the whole evaluation set
    assert 0 < len(frequent) < len(values)
    layers, s = res["layers"], res["summary"].iloc[0]
    for col, keep in (("token_share", None), ("token_share_min_count", frequent)):
        got = np.append(layers[col].to_numpy(), s[col])
        assert got == pytest.approx(brute_token_shares(model, toks, keep), rel=1e-6)  # fp32 forwards by two paths
        loo = np.stack([brute_token_shares(model, without(toks, i), keep) for i in range(N_BATCHES)])
        se = np.append(layers[f"{col}_se"].to_numpy(), s[f"{col}_se"])
        assert (se > 0).all() and se == pytest.approx(jackknife_formula(loo), rel=1e-6)
    # over all tokens the leave-one-out share is the analysis run on the windows without that batch
    for i in range(N_BATCHES):
        alone = gate_stats(model, without(toks, i), min_count=min_count)
        assert alone["summary"]["token_share"].iloc[0] == pytest.approx(
            brute_token_shares(model, without(toks, i))[-1], rel=1e-6
        )
    one = gate_stats(model, toks[:1], min_count=min_count)
    assert one["summary"][["token_share_se", "token_share_min_count_se"]].isna().all(axis=None)


# ------------------------------------------------------------------------------------------------------------ Sink^eps


def test_sink_eps_jackknife_leaves_each_batch_out():
    model, toks = tiny("sinklogit"), windows(N_BATCHES, 2, 12)
    # a threshold between one head's leave-one-out scores, so that the share of sink heads moves with the batches
    alpha = np.stack([sink_heads(model, without(toks, i))["heads"]["key0_mass"].to_numpy() for i in range(N_BATCHES)])
    head = int(np.argmax(alpha.max(0) - alpha.min(0)))
    eps = [float(alpha[:, head].min() + alpha[:, head].max()) / 2, 0.3]
    full = sink_heads(model, toks, eps=eps)
    loo = [sink_heads(model, without(toks, i), eps=eps) for i in range(N_BATCHES)]
    s = full["summary"].set_index("epsilon")
    lay = full["layers"].set_index(["epsilon", "layer"])
    for col in ("sink_share", "key0_mass"):
        theta = np.stack([r["summary"].set_index("epsilon")[col].to_numpy() for r in loo])  # (n, eps)
        assert s[f"{col}_se"].to_numpy() == pytest.approx(jackknife_formula(theta), rel=1e-9, abs=1e-15)
        theta = np.stack([r["layers"].set_index(["epsilon", "layer"]).loc[lay.index, col].to_numpy() for r in loo])
        assert lay[f"{col}_se"].to_numpy() == pytest.approx(jackknife_formula(theta), rel=1e-9, abs=1e-15)
    assert s.loc[eps[0], "sink_share_se"] > 0 and s.loc[eps[0], "key0_mass_se"] > 0
    cols = list(full["layers"].columns)
    assert cols.index("sink_share_se") == cols.index("sink_share") + 1


# ------------------------------------------------------------------------------------------------------------ pages


def test_pages_and_figures_show_the_standard_errors():
    from probe.present.report import report_figures, report_page

    model, toks = tiny("sinklogit"), windows(N_BATCHES, 2, 12)
    heads = sink_heads(model, toks, eps=[0.05, 0.3])
    sec = sink_sections(
        {
            "summary": pd.DataFrame([{"sink_formed": False, "pos0_over_uniform": 1.0, "r0_later": 1.0}]),
            "layers": pd.DataFrame({"layer": [0, 1]}),
            "sink_eps_summary": heads["summary"],
            "sink_eps_layers": heads["layers"],
        }
    )
    e = heads["summary"].iloc[0]
    assert f"({e['sink_share']:.1%} ± {e['sink_share_se']:.1%})" in sec["verdicts"][1]
    assert any("sink_share_se" in t[1] for t in sec["tables"] if "per layer" in t[0])
    fig = sink_eps_figure(heads)
    left = [t for t in fig.data if t.type == "scatter"]
    for t, (_, g) in zip(left, heads["layers"].groupby("epsilon", sort=False)):
        assert list(t.error_y.array) == pytest.approx(g["sink_share_se"].tolist())
    trend = sink_eps_trend_figure(heads["summary"].assign(model="m"))
    assert list(trend.data[0].error_y.array) == pytest.approx([e["sink_share_se"]])

    exp = exposure_stats(model, toks, cutoffs=["q25"])
    sec = inject_sections({"results": pd.DataFrame(columns=["junk", "cutoff", "dose", "delta"]), **exp})
    row = exp["exposure"].iloc[0]
    assert any(f"{row['quiet_share']:.1%} ± {row['quiet_share_se']:.1%}" in v for v in sec["verdicts"])
    assert [t[0] for t in sec["tables"]][-1].startswith("Exposure per layer")
    bars = exposure_figure(exp)
    assert [b.error_y.array[0] for b in bars.data] == pytest.approx([row["quiet_share_se"], row["phantom_share_se"]])

    gates = gate_stats(tiny("normgate"), toks, min_count=2)
    s = gates["summary"].iloc[0]
    assert (
        f"{s['token_share']:.1%} ± {s['token_share_se']:.1%} of the gate variance"
        in gate_sections(gates)["verdicts"][1]
    )
    token_panel = [t for t in gate_figure(gates).data if t.xaxis == "x3"][0]
    assert list(token_panel.error_y.array) == pytest.approx(gates["layers"]["token_share_se"].tolist())

    # the report: bars from the saved *_se columns; older records without them still draw, without bars
    def report_tables(with_se: bool) -> dict:
        def rows(t):
            t = t.assign(model="m", step=None)
            return t if with_se else t[[c for c in t.columns if not c.endswith("_se")]]

        summary = pd.DataFrame(
            {
                "model": ["m"],
                "step": [None],
                "pos0_share": [0.5],
                "uniform_ref": [0.2],
                "pos0_over_uniform": [2.5],
                "phantom_share": [0.1],
                "r0_later": [0.9],
                "sink_formed": [False],
            }
        )
        layers = pd.DataFrame(
            {"model": "m", "layer": [0, 1], "pos0_share": 0.5, "phantom_share": 0.1, "r0": 0.9, "uniform_ref": 0.2}
        )
        return {
            "summary": summary,
            "layers": layers,
            "sink_eps": rows(heads["summary"]),
            "sink_eps_layers": rows(heads["layers"]),
            "exposure": rows(exp["exposure"]),
        }

    figs = report_figures(report_tables(True))
    trend, prof, exposure = figs[-3], figs[-2], figs[-1]
    assert trend.data[0].error_y.array == pytest.approx((e["sink_share_se"],))
    assert list(prof.data[0].error_y.array) == pytest.approx(
        heads["layers"].query("epsilon == 0.05")["sink_share_se"].tolist()
    )
    assert [t.error_y.array[0] for t in exposure.data] == pytest.approx(
        [row["quiet_share_se"], row["phantom_share_se"]]
    )
    old = report_figures(report_tables(False))
    assert len(old) == len(figs) and all(t.error_y.array is None for f in old[-3:] for t in f.data)
    settings = dict(
        batches=N_BATCHES,
        batch_size=2,
        ctx=12,
        window_mode="sequential",
        seed=0,
        device="cpu",
        dtype="auto",
        inject=None,
        probe_version="x",
    )
    html = report_page(report_tables(True), [{"name": "m", "meta": {}}], settings)
    for col in ("sink_share_se", "key0_mass_se", "quiet_share_se", "phantom_share_se"):
        assert f"<th>{col}</th>" in html, col  # the report's tables carry the standard errors
