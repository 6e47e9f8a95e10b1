"""What every analysis shares: evaluation windows, result metadata, and a layer-by-layer hook collector.

Windows follow probe.data.EvalBatches: each is ctx+1 tokens, the model reads ``window[:-1]`` and the next-token
targets are ``window[1:]``. An analysis accepts an EvalBatches, a (B, ctx+1) or (N, B, ctx+1) LongTensor of windows;
a model's default windows, BOS by its rule, come from ``probe.data.windows.default_windows``
(docs/definitions.md#evaluation-windows, docs/definitions.md#bos-rule).

The collector hooks a few named tensors per layer (e.g. q, k, v, sink logit) and hands them to a callback as soon as a
layer's set is complete, then drops them: an analysis never holds more than one layer's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F

from probe.analyses.parallel import gather_rows
from probe.data.seeding import keyed_generator
from probe.errors import AnalysisRefused
from probe.hooks import names
from probe.kernels import attention_row_masses, rule_row_masses
from probe.kernels.diff_attention import SIGNED_RULES
from probe.kernels.row_masses.signed import SignedRowMasses, signed_row_masses
from probe.kernels.row_rules import ROW_RULES, RowRule
from probe.process_group import batches_of_rank, is_main
from probe.progress import progress_bar


@dataclass
class Windows:
    tokens: torch.Tensor  # (N, B, ctx+1) long
    doc_ids: torch.Tensor | None  # (N, B) or None
    meta: dict = field(default_factory=dict)  # corpus identity and sampling settings

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[1]

    def inputs(self, n: int, device=None) -> torch.Tensor:
        return self.tokens[n, :, :-1].to(device)

    def targets(self, n: int, device=None) -> torch.Tensor:
        return self.tokens[n, :, 1:].to(device)


def as_windows(data) -> Windows:
    """EvalBatches or a LongTensor of windows ((B, T+1) or (N, B, T+1)) -> Windows."""
    if isinstance(data, Windows):
        return data
    if hasattr(data, "tokens") and hasattr(data, "to_dict"):  # probe.data.EvalBatches
        return Windows(data.tokens.long(), data.doc_ids, dict(data.to_dict()))
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"expected EvalBatches or a LongTensor of token windows, got {type(data).__name__}")
    if data.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"token windows must be an integer tensor, got {data.dtype}")
    tokens = data.long()
    if tokens.dim() == 2:
        tokens = tokens[None]
    if tokens.dim() != 3 or tokens.shape[-1] < 2:
        raise ValueError(f"token windows must be (B, T+1) or (N, B, T+1) with T+1 >= 2, got {tuple(data.shape)}")
    meta = {
        "corpus": "custom-tokens",
        "seed": None,
        "ctx": tokens.shape[-1] - 1,
        "n_batches": tokens.shape[0],
        "batch_size": tokens.shape[1],
    }
    return Windows(tokens, None, meta)


def describe(model, windows: Windows, analysis: str, **settings) -> dict:
    """The identity of a result: model, corpus (and how its windows were drawn), analysis settings."""
    info = model.probe_info
    meta = {"analysis": analysis, "model": info.name, "family": info.family}
    meta.update({k if k != "seed" else "data_seed": v for k, v in windows.meta.items()})
    meta.update(settings)
    return meta


def tag(df: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """Put the model and corpus identity in front of a table and the full metadata in ``df.attrs['meta']``."""
    df = df.copy()
    df.insert(0, "corpus", meta.get("corpus"))
    df.insert(0, "model", meta.get("model"))
    df.attrs["meta"] = dict(meta)
    return df


def finish(tables: dict[str, pd.DataFrame], meta: dict) -> dict[str, pd.DataFrame]:
    """Tag every table and add a one-row ``meta`` table (what a report writes beside the numbers)."""
    out = {k: tag(v, meta) for k, v in tables.items()}
    out["meta"] = pd.DataFrame(
        [{k: (v if isinstance(v, (int, float, str, bool)) or v is None else repr(v)) for k, v in meta.items()}]
    )
    out["meta"].attrs["meta"] = dict(meta)
    return out


def make_bar(total: int, enabled: bool, desc: str):
    """Progress on stderr: a tqdm bar on a terminal, plain lines otherwise, nothing when not ``enabled``."""
    return progress_bar(total, desc, enabled=enabled)


class StopForward(Exception):
    """Raised from a hook once an analysis has everything it needs: the rest of the forward (the last MLP, the final
    norm and the LM head, often a third of the FLOPs) is skipped. TransformerLens removes the hooks on the way out."""


def run_until_done(model, ids, fwd_hooks, **forward_kwargs):
    """``model.run_with_hooks`` that returns None when a hook stops the forward with StopForward."""
    try:
        return model.run_with_hooks(ids, fwd_hooks=fwd_hooks, **forward_kwargs)
    except StopForward:
        return None


class LayerCollector:
    """Collect per-layer hook tensors; call ``on_layer(layer, {suffix: tensor})`` when a layer's set is complete.

    ``needs(layer)`` gives the suffixes (``hook_rot_q``, ``hook_v``, ...) a layer must deliver. Tensors are detached and
    released after the callback, so peak memory holds one layer's tensors (plus what the model itself holds).
    With ``stop_early`` the forward ends as soon as the last layer is complete (``run`` then returns None).
    """

    def __init__(self, model, needs, on_layer, stop_early: bool = False):
        self.info = model.probe_info
        self.on_layer, self.stop_early = on_layer, stop_early
        # linear layers have no attention hooks; a layer whose needs are empty is not waited for
        self.needs = {l: set(n) for l in self.info.attention_layers if (n := needs(l))}
        self.pending: dict[int, dict[str, torch.Tensor]] = {}
        self.done: set[int] = set()
        wanted = {names.attn(l, s): (l, s) for l, ss in self.needs.items() for s in ss}
        require(model, wanted)
        self.wanted = wanted

    def hooks(self):
        def fn(tensor, hook):
            l, s = self.wanted[hook.name]
            got = self.pending.setdefault(l, {})
            got[s] = tensor.detach()
            if set(got) >= self.needs[l]:
                self.on_layer(l, self.pending.pop(l))
                self.done.add(l)
                if self.stop_early and len(self.done) == len(self.needs):
                    raise StopForward
            return None

        return [(lambda name: name in self.wanted, fn)]

    def run_batches(self, model, windows: Windows, progress: bool, desc: str) -> None:
        """One forward per evaluation batch of this rank (data-parallel runs: whole batches by global index), with
        a progress bar on the main rank."""
        mine = batches_of_rank(len(windows))
        bar = make_bar(len(mine), progress and is_main(), desc)
        for n in mine:
            self.run(model, windows.inputs(n, model_device(model)))
            bar.update()
        bar.close()

    def run(self, model, ids: torch.Tensor, extra_hooks=(), **forward_kwargs):
        """One forward with the collecting hooks; returns the model output (None when stopped early). Raises if a
        layer stayed incomplete."""
        self.pending, self.done = {}, set()
        out = run_until_done(model, ids, self.hooks() + list(extra_hooks), **forward_kwargs)
        missing = [(l, sorted(self.needs[l] - set(self.pending.get(l, {})))) for l in self.needs if l not in self.done]
        if missing:
            l, m = missing[0]
            raise RuntimeError(
                f"model {self.info.name!r} produced no {', '.join(names.attn(l, s) for s in m)} in its "
                f"forward pass ({len(missing)} layer(s) incomplete); this analysis needs those hooks"
            )
        return out


def require(model, hook_names, analysis: str = "this analysis") -> None:
    """Refuse, in one line, an analysis that needs a hook the model never fires (``ModelInfo.lacks``: a point the
    adapter cannot see, an attention hook of a linear-attention layer), before any forward."""
    info = model.probe_info
    for name in hook_names:
        why = info.lacks(name)
        if why is not None:
            raise AnalysisRefused(f"model {info.name!r} cannot run {analysis}: it needs {name}, but {why}")


def model_device(model) -> torch.device:
    """Where the model's inputs go (statistics come back to the CPU): the first parameter that holds data, since
    accelerate leaves weights offloaded to disk on the 'meta' device; the CPU when every weight is offloaded."""
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


def row_mass_hooks(info) -> list[str]:
    """The attention hooks from which probe.kernels.attention_row_masses (softmax rows) or rule_row_masses (a row
    rule of probe.kernels.row_rules) reproduces a layer's attention: the query and key the scores take (hook_rot_q /
    hook_rot_k: after QK-norm and rotary), v, the sink logit where there is a phantom, the gate where a routing-slot
    gate adds log g_j to the logits, the forget gate where FoX adds -Σ_{l<=j} log f_l (``ModelInfo.attention_at``).
    Refused in one line: a row rule beside a phantom key, a routing gate or ALiBi, whose rows these masses would not
    reproduce."""
    rules = [info.attention_at(layer) for layer in info.attention_layers]
    odd = next((r for r in rules if r.rule != "softmax" and (r.phantom or r.gate_on_logits or r.alibi_slopes)), None)
    if odd is not None:
        raise ValueError(
            f"model {info.name!r} has {odd.rule} attention rows with a phantom key, a routing gate or ALiBi, whose "
            "row masses are computed for softmax rows only; run it without this analysis"
        )
    return (
        ["hook_rot_q", "hook_rot_k", "hook_v"]
        + (["hook_sink_logit"] if any(r.phantom for r in rules) else [])
        + (["hook_lse"] if any(r.compress_rate is not None for r in rules) else [])  # compressed entries' share
        + (["hook_v_gate"] if any(r.gate_on_logits for r in rules) else [])
        + (["hook_forget_gate"] if any(r.forget_gate for r in rules) else [])
        + (["hook_lambda"] if any(r.rule in SIGNED_RULES for r in rules) else [])
    )


def sparse_mass_hooks(info) -> list[str]:
    """``row_mass_hooks`` and ``hook_lse``: for analyses whose indicator columns mark few keys (key 0, a massive
    activation's positions) or every key, which the row-mass op then reads in O(T) per row from the forward's
    real-key lse instead of recomputing every score (docs/definitions.md#row-log-normaliser). A row rule other than
    softmax has no lse (``hook_lse`` never fires): its masses are recomputed from the scores."""
    hooks = row_mass_hooks(info)  # compressed layers ask for hook_lse already
    return hooks + (["hook_lse"] if row_rule(info) is None and "hook_lse" not in hooks else [])


def row_rule(info) -> RowRule | None:
    """The model's row rule of probe.kernels.row_rules (softpick, sigmoid, ...) or of differential attention's signed
    rows (probe.kernels.diff_attention.SIGNED_RULES), None for softmax rows."""
    return ROW_RULES.get(info.attention_rule) or SIGNED_RULES.get(info.attention_rule)


def has_branches(info) -> bool:
    """Whether any layer is differential attention's, whose two softmax branches the tables report beside the net
    row (docs/definitions.md#signed-rows)."""
    return any(info.attention_at(l).rule in SIGNED_RULES for l in info.attention_layers)


def row_masses(info, layer: int, got: dict, indicators: torch.Tensor, backend: str | None = None):
    """(lse (B,H,T), masses (B,H,T,m), phantom (B,H,T)) of one layer from the hooks named by ``row_mass_hooks``;
    masses[..., c] is each row's attention mass on the keys marked by indicators[..., c] (phantom in the normaliser):
    its share of the row's total mass, under every rule (docs/definitions.md#rows-of-other-rules).
    The layer's rules are ``info.attention_at(layer)``'s: its scale, window or chunk, soft-cap (Gemma 2:
    ``cap · tanh(scale q·k / cap)``, as in its ``hook_pattern``) and ALiBi slopes, with a routing gate's log g_j and a
    forget gate's -Σ_{l<=j} log f_l (FoX; log of the captured f, where the model takes logsigmoid of its logit).
    ``backend``: the kernels' vocabulary (auto, torch, reference, sdpa, triton, compiled); None follows the runtime
    choice (``probe.kernels.use_backend`` / $PROBE_BACKEND), as models do. With ``hook_lse`` in ``got``
    (``sparse_mass_hooks``) and q in fp32 or fp64, sparse indicators are read from it; a half-precision forward's
    lse is not used (its scores are rounded where these are not).
    A row rule other than softmax takes :func:`rule_masses` instead (its first element is the row's own mass).
    """
    rules = info.attention_at(layer)
    if rules.rule in SIGNED_RULES:  # differential attention: shares of each row's absolute mass
        return signed_masses(info, layer, got, indicators)
    if rules.rule != "softmax":  # no log-normaliser: the rule's own masses (docs/definitions.md#rows-of-other-rules)
        return rule_masses(info, layer, got, indicators)
    q, k, sink = got["hook_rot_q"], got["hook_rot_k"], got.get("hook_sink_logit")
    lse = got.get("hook_lse") if q.dtype in (torch.float32, torch.float64) else None
    if rules.compress_rate is not None:  # the token keys' masses, then the compressed entries' share of the rows
        lse = None
    key_bias = rules.alibi_bias(q.shape[0], q.shape[1], q.device)  # (B, H, T) ALiBi (BLOOM, MPT): H == Hkv
    if "hook_v_gate" in got:  # routing slot: the model adds log g_j to the logits (B, Hkv, T)
        gate = torch.log(got["hook_v_gate"].float().clamp_min(1e-30)).permute(0, 2, 1)
        key_bias = gate if key_bias is None else gate + key_bias
    if rules.forget_gate:  # FoX: -Σ_{l<=j} log f_l (B, Hkv, T)
        forget = rules.forget_bias(got["hook_forget_gate"])
        key_bias = forget if key_bias is None else forget + key_bias
    lse, mass = attention_row_masses(
        q,
        k,
        indicators,
        sink=sink,
        key_bias=key_bias,
        window=rules.window,
        chunk=rules.chunk,
        scale=rules.scale,
        softcap=rules.softcap,
        lse=lse,
        backend=backend,
    )
    lse, mass = lse.float(), mass.float()
    if rules.compress_rate is not None:
        lse, mass = with_compressed_entries(lse, mass, got["hook_lse"], sink, indicators)
    phantom = torch.exp(sink.float()[None, :, None] - lse) if sink is not None else torch.zeros_like(lse)
    return lse, mass, phantom


def with_compressed_entries(lse, mass, real_lse, sink, indicators):
    """(lse, masses) of rows whose normaliser also holds compressed KV entries (DeepSeek-V4,
    docs/definitions.md#compressed-keys): ``lse`` (B,H,T) and ``mass`` (B,H,T,m) are over the token keys and the
    phantom; the forward's ``hook_lse`` (real_lse, B,H,T: token keys and entries) gives the whole normaliser, and
    each token mass shrinks by exp(lse - whole). A column marking every token key marks the entries too (the row's
    real mass, 1 - phantom); any other column marks tokens only. The forward's lse is read whatever its precision (a
    half-precision forward's rounds the normaliser)."""
    whole = real_lse.float()
    if sink is not None:
        whole = torch.logaddexp(whole, sink.float()[None, :, None])
    mass = mass * torch.exp(lse - whole)[..., None]
    every = indicators.flatten(0, 2).bool().all(0)  # (m,) columns marking every key of every sequence and head
    real = torch.exp(real_lse.float() - whole)[..., None].expand_as(mass)
    return whole, torch.where(every.to(mass.device), real, mass)


def signed_masses(info, layer: int, got: dict, indicators: torch.Tensor):
    """``row_masses`` of a layer of differential attention (docs/definitions.md#signed-rows): (the row's signed sum
    Σ_j a_ij = 1 - λ (B,H,T), shares of its absolute mass Σ_j |a_ij| (B,H,T,m), zeros (no unspent mass)), fp32,
    from hook_rot_q / hook_rot_k (both branches) and hook_lambda, over blocks of query rows (signed_row_masses)."""
    return net_and_branches(signed_layer_masses(info, layer, got, indicators))[0]


def signed_layer_masses(info, layer: int, got: dict, indicators: torch.Tensor) -> SignedRowMasses:
    """signed_row_masses of a layer of differential attention under its rules (window, chunk, scale, soft-cap)."""
    rules = info.attention_at(layer)
    return signed_row_masses(
        got["hook_rot_q"],
        got["hook_rot_k"],
        indicators,
        got["hook_lambda"],
        window=rules.window,
        chunk=rules.chunk,
        scale=rules.scale,
        softcap=rules.softcap,
    )


def net_and_branches(m: SignedRowMasses) -> tuple[tuple, tuple[torch.Tensor, torch.Tensor]]:
    """(row_masses' (signed sum, shares of |a|, zeros) of the net row, (branch 1's, branch 2's) masses (B,H,T,m)),
    fp32; each branch is a softmax row summing to one, so its masses are its shares (definitions.md#signed-rows)."""
    net, absolute = m.net.float(), m.absolute.float()
    shares = m.masses.float() / absolute.clamp_min(1e-30)[..., None]
    return (net, shares, torch.zeros_like(net)), (m.branch_1.float(), m.branch_2.float())


def rule_masses(info, layer: int, got: dict, indicators: torch.Tensor):
    """``row_masses`` of a layer whose rows follow a row rule other than softmax
    (docs/definitions.md#rows-of-other-rules): (row mass Σ_j a_ij (B,H,T), shares (B,H,T,m), unspent (B,H,T)), fp32,
    with the masses as shares of the row's total mass. A rule whose rows sum to at most one has total 1: the shares
    are the pattern's own weights and the unspent mass 1 - Σ_j a_ij stands where the phantom does. A rule whose rows
    may sum past one (sigmoid, elu1) has total Σ_j a_ij: the shares are the row's weights over their sum and the
    unspent mass is 0 (none is defined). A row of zero mass has zero shares. Plain torch over blocks of query rows
    (rule_row_masses)."""
    rules, rule = info.attention_at(layer), ROW_RULES[info.attention_rule]
    total, mass = rule_row_masses(
        got["hook_rot_q"],
        got["hook_rot_k"],
        indicators,
        rule=rules.rule,
        bias=rule.bias(info.n_ctx),  # sigmoid's -log n_ctx, as the model adds it
        window=rules.window,
        chunk=rules.chunk,
        scale=rules.scale,
        softcap=rules.softcap,
    )
    total, mass = total.float(), mass.float()
    if rule.at_most_one:
        return total, mass, 1.0 - total
    return total, mass / total.clamp_min(1e-30)[..., None], torch.zeros_like(total)


def logits_of(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy per position, fp32: logits (B, T, V), targets (B, T) -> (B, T)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)


LOSS_CHUNK = 128  # positions unembedded at once: B x 128 x V logits at a time, never B x T x V


def loss_forward_kwargs(model) -> dict:
    """What to pass to a forward whose output goes to :func:`output_losses`: models with ``unembed`` (probe models
    and adapted checkpoints) return their final hidden states instead of logits."""
    return {"return_hidden": True} if hasattr(model, "unembed") else {}


def output_losses(model, out, targets: torch.Tensor, chunk: int = LOSS_CHUNK) -> torch.Tensor:
    """Next-token loss per position (B, T) fp32 of a forward run with :func:`loss_forward_kwargs`: hidden states
    are unembedded ``chunk`` positions at a time (Gemma's 262k vocabulary: full logits of 8 x 1024 positions would
    be 8.6 GB in fp32); a plain logits output is scored as it is."""
    if not hasattr(model, "unembed"):
        return token_losses(logits_of(out), targets)
    targets = targets.to(out.device)
    return torch.cat(
        [
            token_losses(model.unembed(out[:, a : a + chunk]), targets[:, a : a + chunk])
            for a in range(0, out.shape[1], chunk)
        ],
        dim=1,
    )


@torch.no_grad()
def window_losses(model, data, *, progress: bool = False) -> pd.DataFrame:
    """Summed next-token loss and token count per evaluation window (``probe eval``'s table, and the input of the
    document bootstrap); one forward per batch of this rank, rows of every rank gathered in global batch order.

    Columns: batch, row, doc_id (the window's document, or -1), loss_sum, n_tokens, loss (the window's mean)."""
    w = as_windows(data)
    rows, device, mine = [], model_device(model), batches_of_rank(len(w))
    bar = progress_bar(len(mine), "eval", unit="batch", enabled=progress and is_main())
    for n in mine:
        out = model(w.inputs(n, device), **loss_forward_kwargs(model))
        losses = output_losses(model, out, w.targets(n, device)).double().cpu()
        for b in range(w.batch_size):
            rows.append(
                {
                    "batch": n,
                    "row": b,
                    "doc_id": int(w.doc_ids[n, b]) if w.doc_ids is not None else -1,
                    "loss_sum": float(losses[b].sum()),
                    "n_tokens": losses.shape[1],
                    "loss": float(losses[b].mean()),
                }
            )
        bar.update()
    bar.close()
    df = pd.DataFrame(gather_rows(rows))
    df.attrs["meta"] = describe(model, w, "window_losses")
    return df


def token_text(tokenizer, token_id: int) -> str:
    """One token's text for tables and viewers: ``<sink>`` for a negative id (a sink-token slot), the id itself when
    there is no tokenizer or it cannot decode the token alone."""
    if token_id < 0:
        return "<sink>"
    if tokenizer is None:
        return str(token_id)
    try:
        return tokenizer.decode([int(token_id)])
    except Exception:  # noqa: BLE001 - a token a tokenizer cannot decode alone still gets a row
        return str(token_id)


__all__ = [
    "token_text",
    "Windows",
    "as_windows",
    "describe",
    "tag",
    "finish",
    "keyed_generator",
    "make_bar",
    "LayerCollector",
    "require",
    "StopForward",
    "run_until_done",
    "model_device",
    "row_mass_hooks",
    "sparse_mass_hooks",
    "row_masses",
    "rule_masses",
    "signed_masses",
    "signed_layer_masses",
    "net_and_branches",
    "row_rule",
    "has_branches",
    "token_losses",
    "loss_forward_kwargs",
    "output_losses",
    "window_losses",
    "names",
]
