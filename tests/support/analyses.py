"""Helpers of the analysis tests: tiny custom models and random token windows."""

import torch

from probe.hooks import names
from probe.models import create
from tests.support import SMALL

SMALL = dict(SMALL, vocab_size=97)  # random windows draw from 97 ids


def windows(n_batches=2, batch=3, ctx=16, vocab=97, seed=0, low=0):
    """(N, B, ctx+1) random token windows."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, vocab, (n_batches, batch, ctx + 1), generator=g)


def tiny(variant="baseline", seed=0, **over):
    model = create(variant, seed=seed, **{**SMALL, **over})
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if name.endswith("attn.sink"):  # nonzero sink logits
                p.copy_(torch.randn(p.shape, generator=g) * 2)
            elif name.endswith("gate.w"):  # a projection gate with a direction
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("read.query"):  # depth routing that is not uniform
                p.copy_(torch.randn(p.shape, generator=g))
    return model.eval()


def full_jacobian_norms(model, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """‖∂y_{T-1}/∂e_i‖_F for each i of one window (1, T), from the whole (d, T, d) Jacobian."""
    _, cache = model.run_with_cache(ids, names_filter=lambda name: name == names.EMBED)
    e0 = cache[names.EMBED]

    def y_of(e):
        got = {}

        def keep(x, hook):
            got["y"] = x

        model.run_with_hooks(ids, fwd_hooks=[(names.EMBED, lambda x, hook: e), (names.resid(layer, "post"), keep)])
        return got["y"][0, -1]

    J = torch.autograd.functional.jacobian(y_of, e0)  # (d, 1, T, d)
    return J[:, 0].pow(2).sum((0, 2)).sqrt()


def periodic(n_batches, batch, ctx, vocab=32, period=5, seed=0):
    """Windows that repeat a random block of `period` tokens: predictable by attending back `period` positions."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, vocab, (n_batches, batch, period), generator=g)
    return base.repeat(1, 1, (ctx + 1) // period + 1)[..., : ctx + 1]


def trained_periodic(variant="baseline", steps=60, seed=0, period=2):
    """A 2-layer model trained briefly (~1 s) on windows that repeat every `period` tokens, so its loss depends on
    what attention reads (predicting x[t+1] = x[t+1-period] needs attention to an earlier position)."""
    torch.manual_seed(seed)
    model = create(variant, seed=seed, n_layers=2, d_model=32, n_heads=4, d_mlp=64, n_ctx=64, vocab_size=32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = periodic(steps, 16, 32, period=period, seed=seed + 100)
    for x in data:
        logits = model(x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), float(loss.detach())


def every_variant() -> list[tuple[str, dict]]:
    """(variant, overrides) for every registered variant (routed ones at small N and r), plus grouped-query attention
    with a phantom and with a gate: what a test comparing a streaming analysis with the pattern runs over, so a new
    mechanism is covered without editing a list; the variants of every row rule (softpick, sigmoid, elu1, ...)
    included."""
    from probe.models import VARIANTS

    names = [v.replace("{N}", "2").replace("{r}", "8") for v in VARIANTS]  # parametric names at N = 2, r = 8
    return [(v, {}) for v in names] + [("baseline", dict(n_kv_heads=2)), ("sink+proj", dict(n_kv_heads=2))]


def _cached(model, tokens, wanted):
    """Every batch's captured tensors for the hook names in ``wanted``, whole (run_with_cache), concatenated over
    batches along B: {name: (N·B, ...) float64}."""
    got = {}
    for ids in tokens[..., :-1]:
        _, cache = model.run_with_cache(ids, names_filter=lambda name: name in wanted)
        for name in wanted:
            got.setdefault(name, []).append(cache[name].double())
    return {name: torch.cat(parts) for name, parts in got.items()}


@torch.no_grad()
def gate_reference(model, tokens) -> dict:
    """Gate statistics by their definitions (docs/definitions.md#gate-statistics) from whole captured tensors, in
    float64: hook_pattern and hook_v_gate of every layer for windows ``tokens`` (N, B, T+1), every row, head and token
    at once. What the streaming ``gate_stats`` must equal: {"heads", "layers": DataFrames, "token_share": float}."""
    import pandas as pd

    from probe.hooks import names

    info = model.probe_info
    L, H, G = info.n_layers, info.n_heads, info.kv_group
    wanted = [names.attn(l, k) for l in range(L) for k in ("pattern", "v_gate")]
    got = _cached(model, tokens, wanted)
    ids = tokens[..., :-1].reshape(-1, tokens.shape[-1] - 1)  # (N·B, T)
    if info.sink_token:  # the read at position 0 is the sink's: no token
        ids = torch.cat([ids.new_full((ids.shape[0], 1), -1), ids], 1)
    heads, layers, between_all, total_all = [], [], 0.0, 0.0
    for l in range(L):
        a = got[names.attn(l, "pattern")]  # (B, H, T, T) over the real keys
        g = got[names.attn(l, "v_gate")]
        g = g.mean(-1) if g.dim() == 4 else g  # (B, T, Hkv): element-wise gates reduced per read
        w = a / a.sum(-1, keepdim=True)
        gh = g.permute(0, 2, 1).repeat_interleave(G, dim=1)  # (B, H, T): the gate of each key, per query head
        m = torch.einsum("bhij,bhj->bhi", w, gh)
        sel = torch.einsum("bhij,bhij->bhi", w, (gh[:, :, None, :] - m[..., None]) ** 2).sqrt()
        m, sel = m[:, :, 1:], sel[:, :, 1:]  # rows t >= 1
        for h in range(H):
            kv = g[..., h // G]
            heads.append(
                {
                    "layer": l,
                    "head": h,
                    "mean_gate": float(m[:, h].mean()),
                    "selectivity": float(sel[:, h].mean()),
                    "spread": float(m[:, h].std(unbiased=False)),
                    "read_mean_gate": float(kv.mean()),
                    "frac_below_half": float((kv < 0.5).double().mean()),
                }
            )
        between, total = 0.0, 0.0  # token identity: between-token / total sum of squares, per KV head, pooled
        real = ids >= 0
        for kv in range(g.shape[-1]):
            x, t = g[..., kv][real], ids[real]
            per_token = pd.Series(x.numpy()).groupby(t.numpy())
            between += float((per_token.count() * (per_token.mean() - float(x.mean())) ** 2).sum())
            total += float(((x - x.mean()) ** 2).sum())
        between_all, total_all = between_all + between, total_all + total
        mine = [r for r in heads if r["layer"] == l]
        layers.append(
            {
                "layer": l,
                **{k: sum(r[k] for r in mine) / H for k in ("mean_gate", "selectivity", "spread")},
                "read_mean_gate": float(g.mean()),
                "frac_below_half": float((g < 0.5).double().mean()),
                "token_share": between / total,
            }
        )
    return {"heads": pd.DataFrame(heads), "layers": pd.DataFrame(layers), "token_share": between_all / total_all}


@torch.no_grad()
def sources_reference(model, tokens) -> dict:
    """Effective-source statistics by their definitions (docs/definitions.md#effective-sources) from the whole depth
    weights α of every read site (hook_depth_weights, run_with_cache), float64: {"sites": DataFrame with the
    streamed table's columns, "heatmap": {site: {source label: mean α}}, "S_src": int}."""
    import pandas as pd

    from probe.hooks import names

    sites = model.probe_info.extra["depth_sites"]
    got = _cached(model, tokens, [names.depth_weights(s) for s in sites])

    def kind(label):  # full mode: embedding / attention / mlp sources; block mode: embedding / blocks / partial
        return (
            "embedding"
            if label == "embed"
            else "partial"
            if label == "partial"
            else "blocks"
            if label.startswith("block")
            else "attention"
            if label.startswith("attn")
            else "mlp"
        )

    all_kinds = {kind(x) for labels in sites.values() for x in labels}
    rows, heat = [], {}
    for i, (site, labels) in enumerate(sites.items()):
        alpha = got[names.depth_weights(site)].reshape(-1, len(labels))  # (tokens, S): every token of every window
        h = -(alpha * alpha.log()).nan_to_num(0.0).sum(-1)  # Shannon entropy, 0 log 0 = 0
        mean = alpha.mean(0)
        kinds = [kind(x) for x in labels]
        rows.append(
            {
                "site_index": i,
                "site": site,
                "n_sources": len(labels),
                "neff_mean": float(h.exp().mean()),
                "neff_std": float(h.exp().std(unbiased=False)),
                "top1_mass": float(alpha.max(-1).values.mean()),
                "input_dependence": float(-(mean * mean.log()).nan_to_num(0.0).sum() - h.mean()),
                "n_tokens": alpha.shape[0],
                **{f"mass_{k}": float(sum(mean[j] for j in range(len(labels)) if kinds[j] == k)) for k in all_kinds},
            }
        )
        heat[site] = dict(zip(labels, mean.tolist(), strict=True))
    return {"sites": pd.DataFrame(rows), "heatmap": heat, "S_src": sum(len(v) for v in sites.values() if len(v) >= 2)}
