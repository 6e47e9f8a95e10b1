"""Causal interventions on sinks, phantoms, gates and depth routes, as loss changes (docs/definitions.md#ablations).

Each intervention is a typed edit (probe.analyses.interventions: one class per kind, registered by name, its fields a
frozen dataclass) that installs forward hooks (hook names from probe.hooks.names); its outcome is the change in
next-token loss per token, ablated − clean, paired on the same windows, with standard errors over batches. Below,
each kind by its name (the ``intervention`` column; classes Knockout, ValueEdit, PhantomEdit, GateClamp, Eviction,
DepthForcing); the ``setting`` column is the edit's ``label``:

    knockout   key 0 leaves every query's softmax (rows renormalise over the other keys and the phantom; query 0 of a
               head without a phantom keeps its clean row), by the attention op's own per-key bias: an AttentionEdit
               handed from hook_v_out to the layer's op (probe.kernels.sink_attention.edits). Key 0 is the window's
               first position (the learned sink token of the sinktoken variant).
    value      v_0 at hook_v set to zero, to the mean of its KV head's reads over positions 1 .. T-1 of the same
               window, or to the read at position 1 (zero | mean | swap); a value gate sees the edited read.
    phantom    the phantom logit at hook_sink_logit removed (-inf: plain softmax) or fixed (sink-logit c); models
               without a phantom are refused.
    gate       a scalar value gate at hook_v_gate held open (g = 1), closed (g = 0) or at its mean per layer and KV
               head over the clean pass of the same windows. A routing-slot gate (ModelInfo.gate_on_logits) closed
               removes every key from the softmax, as the knockout does key 0: rows without a phantom keep their
               clean row, rows with one go to the phantom (value 0). Element-wise value gates are refused. An output
               gate (hook_out_gate, G1; headwise or element-wise) is held the same way, its mean per layer, head
               (and coordinate); a model with both gates has both held.
    evict      window eviction (StreamingLLM): query t sees keys 0 .. k-1 and t-w+1 .. t, in every layer, carried out
               by the attention op (probe.kernels.sink_attention.edits), keys at their positions in the text
               (``positions="original"``, label ``k=K,w=W``) or within the cache as StreamingLLM assigns them
               (``positions="cache"``, label ``k=K,w=W,pos=cache``: rotary models,
               the queries re-rotated by each layer's own rotary); loss over all queries and over queries t >= k + w.
    register   a test-time register (Jiang et al. 2025): one token with a zero embedding joins the window (before the
               text by default, after it with ``register_at=("end",)``) and the register neurons' activations at
               mlp.hook_post move onto it (probe.analyses.interventions.register); its position is left out of the
               loss; the register token alone is the control. Without ``register_neurons`` the top ones of
               probe.analyses.register_neurons over the same windows are moved. Its rows add the sink shares
               (``pos0_share_clean`` / ``pos0_share_ablated``: the attention mass of text queries t >= 1 on the first
               text token over softmax layers and heads, clean and edited; ``register_share``: on the register).
    depth      a depth read site's weights (hook_depth_weights over sub-layer sources; DenseFormer / MUDD
               dense.hook_weights over block states) forced to the uniform mix, to the standard residual (weight 1
               on every sub-layer source; one-hot on the latest block state for dense mixes), or, for sub-layer
               sources, with one source category dropped (embed / blocks / partial) and the rest renormalised.

Local interventions run on every layer at once (scope "model") and one layer at a time ("layer"; "head": one KV
head, or one query head for phantom edits, with ``per_head``); depth forcings on every site at once and per site.
Mechanisms are found by what the model does (its capabilities and the hooks that fire), never by its name.
A model with linear layers (no softmax attention, docs/definitions.md#layer-types) is ablated in its softmax layers,
which ``meta`` lists (``softmax_layers``, ``linear_layers``): "every layer at once" is every softmax layer, and an
eviction leaves a linear layer's state whole. Its ``results`` get a ``layer_type`` column after ``layer`` and, with
``per_layer``, a row per linear layer and intervention with NaN losses.
Cost: one clean forward per batch plus one forward per condition and batch, then the cost measurement (one warm-up
pair and COST_REPEATS timed pairs of a clean and an ablated forward on one batch; ``cost_summary``).
"""

from __future__ import annotations

import time

import pandas as pd
import torch

from probe.analyses.capture import (
    as_windows,
    describe,
    finish,
    logits_of,
    loss_forward_kwargs,
    make_bar,
    model_device,
    output_losses,
    require,
)
from probe.analyses.interventions import (
    DEFAULT_KEEP,
    DEFAULT_WINDOWS,
    DEPTH_MODES,
    GATE_MODES,
    GATE_POINTS,
    KINDS,
    MAX_POSITIONS,
    MAX_SINK_LOGIT,
    POSITIONS,
    REGISTER_PLACES,
    SOURCE_CATEGORIES,
    VALUE_MODES,
    Ablation,
    AblationError,
    AblationOptions,
    DepthForcing,
    Eviction,
    GateClamp,
    Intervention,
    Knockout,
    Mechanisms,
    NotTaken,
    PhantomEdit,
    TestTimeRegister,
    ValueEdit,
    check_positions,
    check_target,
    find_mechanisms,
    sink_share_hooks,
)
from probe.analyses.layer_types import layer_meta, linear_layers, with_linear_layers
from probe.analyses.parallel import all_sum, gather, gather_rows
from probe.analyses.register_neurons import register_neurons
from probe.analyses.stats import with_batch_se
from probe.hooks import names
from probe.kernels.sink_attention import edits
from probe.process_group import batches_of_rank, is_main

INTERVENTIONS = tuple(KINDS)  # knockout, value, phantom, gate, evict, depth, register (probe.analyses.interventions)
COST_REPEATS = 5  # timed clean / ablated pairs after one warm-up pair (docs/definitions.md#ablations)
COST_SPREAD = 0.25  # the cost ratio is stated when its interquartile range is at most this fraction of its median


# --- the conditions --------------------------------------------------------------------------------------------


def plan(model, mech: Mechanisms, interventions, **settings) -> list[Ablation]:
    """Every condition of the requested interventions, validated against the model; AblationError on one it
    cannot take. ``settings``: the fields of :class:`AblationOptions` (their defaults there)."""
    opts = AblationOptions.of(settings)
    out: list[Ablation] = []
    for name in dict.fromkeys(interventions):
        if name not in KINDS:
            raise AblationError(f"unknown intervention {name!r}; choose from {', '.join(INTERVENTIONS)}")
        try:
            out += KINDS[name].conditions(model, mech, opts)
        except NotTaken as e:  # the refusal names what the model does take
            taken = [other for other in INTERVENTIONS if other != name and takes(model, mech, other)]
            offer = f"it takes {', '.join(taken)}" if taken else "it takes none of the interventions"
            raise NotTaken(f"{e}; {offer}") from None
    return out


def takes(model, mech: Mechanisms, name: str) -> bool:
    """Whether the model takes intervention ``name`` with its default settings."""
    try:
        KINDS[name].conditions(model, mech, AblationOptions())
    except AblationError:
        return False
    return True


def ablation_hooks(
    model, abl: Ablation, mech: Mechanisms | None = None, gate_means: dict[str, torch.Tensor] | None = None
) -> list:
    """The (hook name, fn) pairs that carry out one condition (``model.run_with_hooks`` inside
    ``edits.carried(model)``: a knockout or eviction is handed to each layer's attention op from its hook_v_out)."""
    check_target(abl, model.probe_info)
    return abl.edit.hooks(model, abl, mech, gate_means)


# --- the run ---------------------------------------------------------------------------------------------------


def _gate_collector(sums: dict, counts: dict):
    """Per gate hook name, the sums of g over windows and positions ((Hkv,), (H,) or (H, dv)) and their count."""

    def fn(g, hook):
        sums[hook.name] = sums.get(hook.name, 0) + g.detach().double().sum((0, 1)).cpu()
        counts[hook.name] = counts.get(hook.name, 0) + g.shape[0] * g.shape[1]

    return [(lambda name: names.is_attn(name, *GATE_POINTS), fn)]


@torch.no_grad()
def ablate(
    model, data, interventions=("knockout", "value"), *, progress: bool = True, **settings
) -> dict[str, pd.DataFrame]:
    """Loss change per condition: tables ``results`` (loss_clean, loss_ablated, delta, delta_se; eviction also over
    queries t >= k + w: *_late; cost_ratio: the median over batches of the condition's forward time over the measured
    clean forward's), ``per_batch`` and ``meta`` (with the measured cost: :func:`cost_summary`); linear layers: the
    module docstring. ``settings``: the fields of :class:`AblationOptions` (value_modes, sink_logits, gate_modes,
    keep, windows, positions, depth_modes, per_layer, per_head; their defaults there, shared with :func:`plan`).

    Tables (columns):

    - ``results``: model, corpus, intervention, setting, scope, layer, head, site, loss_clean, loss_ablated, delta,
      delta_se, n_batches, cost_ratio
    - ``per_batch``: model, corpus, batch, intervention, setting, scope, layer, head, site, n_tokens, clean_sum,
      ablated_sum, delta, forward_s
    """
    opts = AblationOptions.of(settings)
    info = model.probe_info
    require(model, [names.attn(l, "v_out") for l in info.attention_layers], "ablations")
    w = as_windows(data)
    T = w.tokens.shape[-1] - 1
    if T < 2:
        raise AblationError(f"ablations need windows of at least 2 tokens, got {T}")
    device = model_device(model)
    mech = find_mechanisms(model, w.inputs(0, device))
    settings = _with_register_neurons(model, w, interventions, settings)
    conds = plan(model, mech, interventions, **settings)
    _check_room(conds, T, info)
    kw = loss_forward_kwargs(model)
    mine = batches_of_rank(len(w))
    want_means = any(c.edit.needs_gate_means() for c in conds)

    clean, clean_times, gate_means = _clean_pass(model, w, mine, device, kw, want_means)
    bar = make_bar(len(mine) * len(conds), progress and is_main(), f"ablations ({info.name})")
    t0 = time.perf_counter()
    rows = []
    for n in mine:
        ids, tgt = w.inputs(n, device), w.targets(n, device)
        clean_shares: dict = {}
        for c in conds:
            t1 = time.perf_counter()
            lost, shares = _condition_losses(model, c, ids, tgt, kw, (mech, gate_means), clean_shares)
            late = c.edit.late_queries(T)
            rows.append({**_row(c, n, clean[n], lost, late), **shares, "forward_s": time.perf_counter() - t1})
            bar.update()
    bar.close()
    ablated_s = time.perf_counter() - t0
    pairs = _timed_pairs(model, w, mine[0], conds[0], mech, gate_means, device, kw) if mine and conds else ([], [])
    timed = gather(pairs)  # every rank's (clean times, ablated times)
    cost = cost_summary([t for c, _ in timed for t in c], [t for _, a in timed for t in a])
    per_batch = pd.DataFrame(gather_rows(rows))
    results = _results(per_batch)
    # per row: the median over batches of its one timed forward per batch, over the measured clean forward
    per_row = per_batch.groupby(KEYS, sort=False)["forward_s"].median() / cost["clean_forward_s"]
    results = results.merge(per_row.rename("cost_ratio").reset_index(), on=KEYS, how="left")
    results = _with_linear_layers(results, info)
    kinds = set(c.intervention for c in conds)
    meta = describe(
        model,
        w,
        "ablate",
        interventions=",".join(dict.fromkeys(c.intervention for c in conds)),
        per_layer=opts.per_layer,
        per_head=opts.per_head,
        n_conditions=len(conds),
        n_tokens=int(w.tokens[..., 1:].numel()),
        knockout_query0="clean row kept where the head has no phantom" if "knockout" in kinds else "n/a",
        eviction_positions=",".join(dict.fromkeys(opts.positions)) if "evict" in kinds else "n/a",
        gate_means="clean pass" if want_means else "n/a",
        register_neurons=" ".join(f"{l}:{i}" for l, i in settings.get("register_neurons", ())) or "n/a",
        **cost,
        wall_s=all_sum(sum(clean_times)) + all_sum(ablated_s),
        **layer_meta(info),  # a hybrid's interventions act on its softmax layers
    )
    return finish({"results": results, "per_batch": per_batch}, meta)


def _ablated_losses(model, ids, tgt, hooks: list, kw, edit: Intervention | None = None) -> torch.Tensor:
    """Per-token losses (B, T) fp64 on the CPU of one forward under ``hooks`` (the edits they hand to the attention
    ops all taken: edits.carried); an ``edit`` that adds tokens (a test-time register) runs on its extended ids and
    only the text's positions are scored."""
    T = ids.shape[1]
    if edit is not None:
        ids = edit.extend(ids)
    with edits.carried(model):
        out = model.run_with_hooks(ids, fwd_hooks=hooks, **kw)
    if edit is not None and edit.extra_tokens:
        out = logits_of(out)[:, edit.text_slice(T)]  # hidden states or logits of the text
    return output_losses(model, out, tgt).double().cpu()


def _condition_losses(model, c: Ablation, ids, tgt, kw, found, clean_shares: dict) -> tuple[torch.Tensor, dict]:
    """One condition's per-token losses and, for a test-time register, its row's sink-share sums (the clean ones
    from one clean forward per batch, kept in ``clean_shares``). ``found``: (mechanisms, gate means)."""
    hooks = ablation_hooks(model, c, *found)
    if not c.edit.extra_tokens:
        return _ablated_losses(model, ids, tgt, hooks, kw, c.edit), {}
    info, T = model.probe_info, ids.shape[1]
    if not clean_shares:
        model.run_with_hooks(ids, fwd_hooks=sink_share_hooks(info, slice(0, T), None, clean_shares), **kw)
    sums: dict = {}
    hooks += sink_share_hooks(info, c.edit.text_slice(T), c.edit.register_index(T), sums)
    lost = _ablated_losses(model, ids, tgt, hooks, kw, c.edit)
    nan = float("nan")
    shares = {
        "share_rows": sums.get("rows", 0),
        "pos0_clean_sum": clean_shares.get("pos0", nan),
        "pos0_ablated_sum": sums.get("pos0", nan),
        "register_sum": sums.get("register", nan),
    }
    return lost, shares


def _check_room(conds: list[Ablation], T: int, info) -> None:
    """One AblationError line when a condition's added tokens (a test-time register) take a window past the
    model's context."""
    extra = max((c.edit.extra_tokens for c in conds), default=0)
    if T + extra > info.n_ctx:
        raise AblationError(
            f"a test-time register adds {extra} token to windows of {T}, past the context {info.n_ctx} of model "
            f"{info.name!r}: give windows of at most {info.n_ctx - extra} tokens (--ctx)"
        )


def _with_register_neurons(model, w, interventions, settings: dict) -> dict:
    """A register run without ``register_neurons`` moves the top ones of probe.analyses.register_neurons over the
    same windows (its default options)."""
    if "register" not in interventions or settings.get("register_neurons"):
        return settings
    try:
        top = register_neurons(model, w)["neurons"]
    except ValueError as e:
        raise AblationError(str(e)) from None
    return {**settings, "register_neurons": tuple(zip(top["layer"].tolist(), top["neuron"].tolist()))}


_clock = time.perf_counter  # the cost measurement's clock (tests replace it)


def _timed_pairs(model, w, n: int, cond, mech, gate_means, device, kw, repeats: int = COST_REPEATS):
    """(clean times, ablated times): one untimed warm-up pair, then ``repeats`` pairs of forwards (each with its loss,
    read back to the CPU) on batch ``n``, clean and ablated interleaved, the order alternating (ABBA) so that a drift
    in speed falls on both alike."""
    ids, tgt = w.inputs(n, device), w.targets(n, device)

    def clean():
        output_losses(model, model.run_with_hooks(ids, fwd_hooks=[], **kw), tgt).double().cpu()

    def ablated():
        _ablated_losses(model, ids, tgt, ablation_hooks(model, cond, mech, gate_means), kw, cond.edit)

    clean()
    ablated()
    times: dict = {clean: [], ablated: []}
    for r in range(repeats):
        for forward in (clean, ablated) if r % 2 == 0 else (ablated, clean):
            t0 = _clock()
            forward()
            times[forward].append(_clock() - t0)
    return times[clean], times[ablated]


def cost_summary(clean_s, ablated_s, spread: float = COST_SPREAD) -> dict:
    """The cost ``meta`` of timed pairs (docs/definitions.md#ablations): the median clean and ablated forward times,
    the median and quartiles of the per-pair ratio ablated / clean, the number of pairs, and whether the ratio is
    stated: its interquartile range at most ``spread`` of its median (no pairs: NaN, not stated)."""
    ratios = torch.tensor([a / c if c > 0 else float("nan") for c, a in zip(clean_s, ablated_s)], dtype=torch.float64)
    if not len(ratios) or ratios.isnan().any():
        keys = ("clean_forward_s", "ablated_forward_s", "cost_ratio", "cost_ratio_q1", "cost_ratio_q3")
        return {**dict.fromkeys(keys, float("nan")), "cost_repeats": len(ratios), "cost_stated": False}
    q1, med, q3 = torch.quantile(ratios, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)).tolist()
    return dict(
        clean_forward_s=float(torch.tensor(clean_s, dtype=torch.float64).quantile(0.5)),
        ablated_forward_s=float(torch.tensor(ablated_s, dtype=torch.float64).quantile(0.5)),
        cost_ratio=med,
        cost_ratio_q1=q1,
        cost_ratio_q3=q3,
        cost_repeats=len(ratios),
        cost_stated=bool(q3 - q1 <= spread * med),
    )


def _clean_pass(model, w, mine, device, kw, want_means: bool):
    """(clean per-token losses (B, T) per batch, each forward's wall time, the gates' means or None) over this rank's
    batches: the gate means need all of them before any clamp at the mean."""
    clean, sums, counts, times = {}, {}, {}, []
    for n in mine:
        t0 = time.perf_counter()
        out = model.run_with_hooks(
            w.inputs(n, device), fwd_hooks=_gate_collector(sums, counts) if want_means else [], **kw
        )
        clean[n] = output_losses(model, out, w.targets(n, device)).double().cpu()  # (B, T)
        times.append(time.perf_counter() - t0)
    if not want_means:
        return clean, times, None
    sums, counts = all_sum(sums), all_sum(counts)
    return clean, times, {n: (sums[n] / counts[n]).float() for n in sums}  # per gate hook: (Hkv,), (H,) or (H, dv)


KEYS = ["intervention", "setting", "scope", "layer", "head", "site"]
SHARE_SUMS = ("share_rows", "pos0_clean_sum", "pos0_ablated_sum", "register_sum")  # a test-time register's rows


def _with_linear_layers(results: pd.DataFrame, info) -> pd.DataFrame:
    """A hybrid model's results with a ``layer_type`` column (the ablated layer's type; "" for every layer at once or
    a depth site) and, beside each intervention's one-layer rows, one row per linear layer: marked "linear", its
    losses NaN (a linear layer has nothing these interventions edit). Other models' results are returned as they
    are."""
    if not linear_layers(info):
        return results
    kinds = [info.layer_types[l] if s in ("layer", "head") else "" for l, s in zip(results["layer"], results["scope"])]
    results = results.assign(layer_type=kinds)
    results = results[[*results.columns[:4], "layer_type", *results.columns[4:-1]]]  # beside the layer
    local = results[results["scope"] == "layer"]
    if local.empty:
        return results
    added = with_linear_layers(local, info, by=["intervention", "setting", "scope"])
    added = added[added["layer_type"] == "linear"].assign(head=-1, site="")
    out = pd.concat([results, added], ignore_index=True)
    group = out["intervention"] + "\0" + out["setting"]
    rank = pd.DataFrame({"g": group.map({g: i for i, g in enumerate(dict.fromkeys(group))}), "l": out["layer"]})
    rank["h"] = out["head"]
    return out.loc[rank.sort_values(["g", "l", "h"], kind="stable").index].reset_index(drop=True)


def _row(c: Ablation, batch: int, clean: torch.Tensor, ablated: torch.Tensor, late: torch.Tensor | None) -> dict:
    row = {
        "batch": batch,
        "intervention": c.intervention,
        "setting": c.setting,
        "scope": c.scope,
        "layer": -1 if c.layer is None else c.layer,
        "head": -1 if c.head is None else c.head,
        "site": c.site or "",
        "n_tokens": clean.numel(),
        "clean_sum": float(clean.sum()),
        "ablated_sum": float(ablated.sum()),
    }
    row["delta"] = (row["ablated_sum"] - row["clean_sum"]) / row["n_tokens"]
    if late is not None:
        n_late = int(late.sum()) * clean.shape[0]
        row.update(
            n_late=n_late, clean_late_sum=float(clean[:, late].sum()), ablated_late_sum=float(ablated[:, late].sum())
        )
        row["delta_late"] = (row["ablated_late_sum"] - row["clean_late_sum"]) / n_late if n_late else float("nan")
    return row


def _results(per_batch: pd.DataFrame) -> pd.DataFrame:
    """Pooled means over every batch (sums over tokens), delta's standard error over batches (with_batch_se)."""
    sums = [
        c
        for c in ("n_tokens", "clean_sum", "ablated_sum", "n_late", "clean_late_sum", "ablated_late_sum", *SHARE_SUMS)
        if c in per_batch
    ]
    grouped = per_batch.groupby(KEYS, sort=False)
    g = grouped[sums].sum(min_count=1).join(grouped.size().rename("n_batches")).reset_index()
    res = g[KEYS].copy()
    res["loss_clean"] = g["clean_sum"] / g["n_tokens"]
    res["loss_ablated"] = g["ablated_sum"] / g["n_tokens"]
    res["delta"] = res["loss_ablated"] - res["loss_clean"]
    cols = ["delta"]
    if "n_late" in g:
        late = g["n_late"].where(g["n_late"] > 0)
        res["loss_clean_late"] = g["clean_late_sum"] / late
        res["loss_ablated_late"] = g["ablated_late_sum"] / late
        res["delta_late"] = res["loss_ablated_late"] - res["loss_clean_late"]
        cols.append("delta_late")
    if "share_rows" in g:
        rows = g["share_rows"].where(g["share_rows"] > 0)
        res["pos0_share_clean"] = g["pos0_clean_sum"] / rows
        res["pos0_share_ablated"] = g["pos0_ablated_sum"] / rows
        res["register_share"] = g["register_sum"] / rows
    res["n_batches"] = g["n_batches"]
    return with_batch_se(res, per_batch, cols, by=KEYS)


__all__ = [
    "ablate",
    "plan",
    "ablation_hooks",
    "find_mechanisms",
    "check_positions",
    "check_target",
    "Ablation",
    "AblationError",
    "NotTaken",
    "AblationOptions",
    "Intervention",
    "Knockout",
    "ValueEdit",
    "PhantomEdit",
    "GateClamp",
    "Eviction",
    "DepthForcing",
    "TestTimeRegister",
    "Mechanisms",
    "INTERVENTIONS",
    "VALUE_MODES",
    "GATE_MODES",
    "DEPTH_MODES",
    "SOURCE_CATEGORIES",
    "DEFAULT_KEEP",
    "DEFAULT_WINDOWS",
    "POSITIONS",
    "REGISTER_PLACES",
    "MAX_POSITIONS",
    "MAX_SINK_LOGIT",
]
