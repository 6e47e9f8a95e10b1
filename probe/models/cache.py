"""``ActivationCache``: what ``run_with_cache`` returns on probe's models and on the HF adapters — a dict of hook name
-> tensor (a ``dict`` subclass, so code that reads it as one keeps working) that is also TransformerLens's
``ActivationCache``, with ``decompose_resid``, ``accumulated_resid``, ``apply_ln_to_stack``, ``stack_head_results``,
``logit_attrs``, a logit lens (``logit_lens``) and a per-source lens (``source_lens``) computed from the cached hooks
and a small protocol instead of HookedTransformer's ``cfg`` and weight names.

The protocol (``ProbeForCausalLM`` and ``probe.checkpoints.hooked_hf.HookedHF`` both provide it):

* ``probe_info``: n_layers, n_heads, layer_types, absent_hooks, the depth routing and its read sites;
* ``norm_module(layer=None, which="ln1")``: the final norm (layer None) or block ``layer``'s norm ``which`` (ln1 the
  attention's input, ln2 the MLP's), None where the block has none (post-norm, a parallel block's MLP);
  :func:`describe_norm` reads it as a :class:`NormAffine` and checks that description against the module's output;
* ``unembedding()``: the LM head as an :class:`Unembedding` (weight rows are the token directions, bias, soft-cap);
  ``unembed(hidden)``: logits of final-normed hidden states; ``to_single_token(text)``;
* depth-routed probe models also ``depth_block_factor(count)``: what a block source of ``count`` sub-layer outputs
  is multiplied by (the block mean count**-p; 1 in full routing).

Streams and their parts. The stream before block l is ``blocks.{l}.hook_resid_pre`` (the routed read on a
depth-routed model), the MLP's input stream ``hook_resid_mid``, and the final stream — what the final norm reads — the
last ``hook_resid_post`` (a dense model's: the last dense mix of the block states). A stream is a linear combination
of its *terms*: the embedding (``hook_embed`` + ``hook_pos_embed``) and the sub-layer outputs (``hook_attn_out``,
``hook_mlp_out``), each with a coefficient: 1 on a plain residual stream; on a depth-routed model the read's depth
weight α_s (times the block mean's factor for a member of a block source); on a dense model (DenseFormer, MUDD) the
mixing weights unrolled through the block states. ``decompose_resid`` returns the terms times their coefficients, and
checks that they sum to the stream (a post-norm block, a term left out of the cache: one line, never a wrong stack).

Norms. ``apply_ln_to_stack`` treats each entry of a stack as a part of a norm's input: centred where the norm is a
LayerNorm, divided by the norm's cached ``hook_scale`` (TransformerLens's), then ``affine``: ``"none"`` stops there
(TransformerLens's value, ``hook_normalized`` for the whole stream), ``"weight"`` (default) multiplies by the norm's
gain (Gemma: 1 + w) — a component's share of the norm's output, which sums over a decomposition to that output less
the bias — and ``"full"`` adds the bias too (for stacks of whole streams: the norm's output itself).
"""

from __future__ import annotations

import copy
from collections.abc import MutableMapping
from dataclasses import dataclass

import torch
from transformer_lens.ActivationCache import ActivationCache as TLActivationCache
from transformer_lens.utilities import Slice, get_act_name

from probe.hooks import names
from probe.models.hyper import HyperConnection, read_streams

AFFINES = ("none", "weight", "full")
# |Σ terms − stream| / |stream| a decomposition may show from rounding alone, by dtype (half: 16-bit adds)
SUM_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}
HALF_SUM_TOLERANCE = 5e-2
# how far a norm module's output (per row) or the LM head's may be from its description (relative): the forms differ
# by O(1), and HF's norms compute in fp32 whatever the model's dtype (an fp64 model's too), bf16 / fp16 in half
NORM_TOLERANCE = {torch.float64: 1e-5, torch.float32: 1e-5}
HALF_NORM_TOLERANCE = 2e-2
EPS_NAMES = ("eps", "variance_epsilon", "epsilon", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")
EPS_GUESSES = (1e-5, 1e-6, 1e-8, 1e-12, 0.0)  # norms that hard-code theirs (OLMo's LayerNorm: 1e-5)


class CacheError(ValueError):
    """A cache method whose precondition fails: one line naming what is missing."""


@dataclass(frozen=True)
class NormAffine:
    """A LayerNorm or RMSNorm as out = normalized · weight + bias with normalized = (x − centre) / scale,
    scale = √(mean((x − centre)²) + eps) and centre = mean(x) (LayerNorm) or 0 (RMSNorm): the norm's ``hook_scale``
    and ``hook_normalized`` (docs/definitions.md#hook-namespace). ``weight`` is the effective gain (Gemma's 1 + w);
    None: no gain (or no bias). ``eps`` None: unknown (only recomputing a scale needs it)."""

    centred: bool
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    eps: float | None

    def normalize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """(x − centre) / scale over the last dimension; scale None: x's own (the norm applied to x as a stream)."""
        centred = x - x.mean(-1, keepdim=True) if self.centred else x
        return centred / (self.scale(x) if scale is None else scale.to(x.dtype))

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """√(mean((x − centre)²) + eps) (…,1): the norm's divisor of the stream x, its hook_scale."""
        if self.eps is None:
            raise CacheError("recomputing a norm's scale needs its eps, which the norm module does not name")
        centred = x - x.mean(-1, keepdim=True) if self.centred else x
        return (centred.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()

    def affine(self, normalized: torch.Tensor, bias: bool = True) -> torch.Tensor:
        """normalized · weight (+ bias)."""
        out = normalized if self.weight is None else normalized * self.weight.to(normalized)
        return out + self.bias.to(normalized) if bias and self.bias is not None else out


@dataclass(frozen=True)
class Unembedding:
    """The LM head: logits = softcap(hidden @ weight.T + bias). Row t of ``weight`` (V,d) is token t's direction;
    ``softcap`` (Gemma 2's final_logit_softcapping) makes the logits cap · tanh(z / cap), not linear in the stream."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    softcap: float | None = None


def _tolerance(dtype: torch.dtype, table: dict, half: float) -> float:
    return table.get(dtype, half)


def describe_norm(module, where: str) -> NormAffine:
    """``module`` (a LayerNorm or RMSNorm of any library) as a :class:`NormAffine`, checked against its own output:
    the form (centred or not; gain w, Gemma's 1 + w or none; eps its own or a usual one) that reproduces the module on
    a test input whose rows have a mean offset (so centring shows) and two sizes, one near √eps (so eps shows); none
    does: :class:`CacheError` naming ``where``."""
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    weight = weight if isinstance(weight, torch.Tensor) else None
    bias = bias if isinstance(bias, torch.Tensor) else None
    x = _norm_input(module, weight)
    with torch.no_grad():
        want = module(x).double()
        wide = torch.promote_types(x.dtype, torch.float32)  # Gemma adds 1 to its gain in fp32
        gains = [weight, 1 + weight.to(wide)] if weight is not None else [None]
        tol = _tolerance(x.dtype, NORM_TOLERANCE, HALF_NORM_TOLERANCE)
        for eps in _eps_candidates(module):
            for centred in (False, True):
                for gain in gains:
                    form = NormAffine(centred, gain, bias, eps)
                    got = form.affine(form.normalize(x.double())).to(x.dtype).double()
                    if bool(((got - want).norm(dim=-1) <= tol * want.norm(dim=-1)).all()):
                        return form
    raise CacheError(
        f"{where}: {type(module).__name__} is not a LayerNorm or RMSNorm of the form (x - mean) / scale * weight + "
        "bias (Gemma: 1 + weight), so the cache cannot apply it to a stack"
    )


def _norm_input(module, weight: torch.Tensor | None) -> torch.Tensor:
    """A seeded 1,6,d test input in the module's dtype and device: rows offset from 0, three of them small."""
    ref = weight if weight is not None else next(module.parameters(), None)
    d = weight.shape[-1] if weight is not None else module.normalized_shape[-1]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 6, d, generator=g, dtype=torch.float64) * 2 + 1.5
    x = x * torch.tensor([1.0] * 3 + [1e-3] * 3, dtype=torch.float64)[None, :, None]
    return x.to(dtype=ref.dtype, device=ref.device) if ref is not None else x.float()


def _eps_candidates(module) -> list[float]:
    named = [float(e) for n in EPS_NAMES if isinstance(e := getattr(module, n, None), (int, float))]
    return named + [e for e in EPS_GUESSES if e not in named]


class _Storage(MutableMapping):
    """The cache's own dict storage, as TransformerLens's methods reach it (``self.cache_dict``)."""

    def __init__(self, owner: dict):
        self._owner = owner

    def __getitem__(self, key):
        return dict.__getitem__(self._owner, key)

    def __setitem__(self, key, value):
        dict.__setitem__(self._owner, key, value)

    def __delitem__(self, key):
        dict.__delitem__(self._owner, key)

    def __iter__(self):
        return dict.__iter__(self._owner)

    def __len__(self):
        return dict.__len__(self._owner)


@dataclass
class _Term:
    """One term of a stream: ``coef · value`` (coef 1, or per position …,T), labelled as TransformerLens labels it."""

    label: str
    kind: str  # "embed", "attn" or "mlp": what decompose_resid's mode and incl_embeds select
    value: torch.Tensor  # …,T,d
    coef: torch.Tensor | float = 1.0

    def tensor(self) -> torch.Tensor:
        if isinstance(self.coef, torch.Tensor):
            return self.value * self.coef.to(self.value.dtype)[..., None]
        return self.value if self.coef == 1.0 else self.value * self.coef


def _refusal(method: str, why: str):
    def refused(self, *args, **kwargs):
        raise CacheError(f"{method}: {why}")

    refused.__name__ = method
    refused.__doc__ = f"Not available on probe's models: {why}."
    return refused


class ActivationCache(dict, TLActivationCache):
    """A dict of hook name -> tensor that is TransformerLens's ``ActivationCache`` (module docstring). Indexing takes
    TransformerLens's short names too (``cache["pattern", 1]``, ``cache["resid_pre", -1]``); ``to``,
    ``remove_batch_dim``, ``apply_slice_to_batch_dim`` and ``toggle_autodiff`` are TransformerLens's own."""

    def __init__(self, cache_dict: dict, model, has_batch_dim: bool = True):
        dict.__init__(self)
        TLActivationCache.__init__(self, cache_dict, model, has_batch_dim)
        self._norms: dict = {}  # (layer, which) -> the norm, described once
        self._scales_checked: set[str] = set()  # the hook_scale entries shown to be their stream's

    # ---- the dict ---------------------------------------------------------------------------------------
    @property
    def cache_dict(self) -> MutableMapping:
        return _Storage(self)

    @cache_dict.setter
    def cache_dict(self, entries: dict) -> None:
        entries = dict(entries)  # TransformerLens's ``to`` builds the new dict from this one's items
        dict.clear(self)
        dict.update(self, entries)

    def __getitem__(self, key) -> torch.Tensor:
        if isinstance(key, str) and dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        if isinstance(key, tuple) and len(key) > 1 and isinstance(key[1], int) and key[1] < 0:
            key = (key[0], self.n_layers + key[1], *key[2:])
        return dict.__getitem__(self, get_act_name(*key) if isinstance(key, tuple) else get_act_name(key))

    def __repr__(self) -> str:
        return f"ActivationCache with keys {list(dict.keys(self))}"

    def keys(self):
        return dict.keys(self)

    def values(self):
        return dict.values(self)

    def items(self):
        return dict.items(self)

    def __iter__(self):
        return dict.__iter__(self)

    def __len__(self) -> int:
        return dict.__len__(self)

    def __copy__(self):
        return type(self)(dict(self), self.model, self.has_batch_dim)

    def __deepcopy__(self, memo):
        # the model is not the cache's content: a deep copy shares it
        return type(self)({k: copy.deepcopy(v, memo) for k, v in dict.items(self)}, self.model, self.has_batch_dim)

    def __reduce__(self):
        # pickled (torch.save) as the plain dict it holds: the tensors, not the whole model (torch.save(dict(cache))
        # for a torch.load with weights_only=True); ActivationCache(loaded, model) gives the methods back
        return (dict, (dict(self),))

    def apply_slice_to_batch_dim(self, batch_slice) -> ActivationCache:
        sliced = TLActivationCache.apply_slice_to_batch_dim(self, batch_slice)
        return type(self)(dict(sliced.cache_dict), self.model, sliced.has_batch_dim)

    def stack_activation(self, activation_name: str, layer: int = -1, sublayer_type: str | None = None):
        """TransformerLens's: the activation of every layer before ``layer`` (-1 / None: all), stacked."""
        return torch.stack([self[(activation_name, l, sublayer_type)] for l in range(self._layer(layer))], dim=0)

    # ---- the model ----------------------------------------------------------------------------------------
    @property
    def info(self):
        if self.model is None:
            raise CacheError("this cache has no model: ActivationCache(dict(cache), model) gives it one")
        return self.model.probe_info

    @property
    def n_layers(self) -> int:
        return self.info.n_layers

    def _layer(self, layer: int | None) -> int:
        """None and -1 mean n_layers (the final stream); otherwise 0 .. n_layers."""
        n = self.n_layers
        if layer is None or layer == -1:
            return n
        if not isinstance(layer, int) or not 0 <= layer <= n:
            raise CacheError(f"layer {layer!r}: choose 0 .. {n} (or -1 / None for the final stream)")
        return layer

    def _need(self, name: str, method: str) -> torch.Tensor:
        """The cached tensor ``name``, or a CacheError saying why it is missing."""
        if dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        layer = names.layer_of(name)
        why = self.info.lacks(name)
        if why is None and layer is not None and self.info.layer_types[layer] == "linear":
            why = f"layer {layer} is a linear-attention (or state-space) layer"
        if why is None:
            hooked = name in getattr(self.model, "hook_dict", {})
            why = "not cached: a names_filter left it out" if hooked else "the model has no such hook point"
        raise CacheError(f"{method}: no {name} in this cache ({why})")

    def _stream_kind(self) -> str:
        """'routed' (depth reads over sub-layer sources), 'streams' (n hyper-connected streams: HC, mHC,
        DeepSeek-V4), 'dense' (DenseFormer / MUDD mixes) or 'residual'."""
        info = self.info
        if info.has_depth_sources:
            return "routed"
        if info.extra.get("hc_streams"):
            return "streams"
        return "dense" if info.depth_routing != "residual" else "residual"

    # ---- the terms of a stream ----------------------------------------------------------------------------
    def _embed_terms(self, method: str, coef: torch.Tensor | float = 1.0) -> list[_Term]:
        terms = [_Term("embed", "embed", self._need(names.EMBED, method), coef)]
        if dict.__contains__(self, names.POS_EMBED):
            terms.append(_Term("pos_embed", "embed", dict.__getitem__(self, names.POS_EMBED), coef))
        return terms

    def _sublayer(self, layer: int, kind: str, method: str, coef: torch.Tensor | float = 1.0) -> _Term:
        return _Term(f"{layer}_{kind}_out", kind, self._need(names.sublayer_out(layer, kind), method), coef)

    def _terms(self, layer: int, mlp_input: bool, method: str) -> list[_Term]:
        """The terms of the stream before block ``layer`` (before its MLP with ``mlp_input``; n_layers: the final
        stream), in TransformerLens's order: embed, pos_embed, then attn_out and mlp_out layer by layer."""
        kind = self._stream_kind()
        if kind == "streams":
            raise CacheError(
                f"{method}: {self.info.name} has {self.info.extra['hc_streams']} hyper-connected streams, whose sum "
                "is not a sum of the sub-layers' outputs (H_res mixes the streams, H_post scales each write: "
                "docs/definitions.md#hyper-connections); each read's sources are probe.analyses.streams.composed_reads"
                " (probe sources)"
            )
        if kind == "routed":
            return self._routed_terms(layer, mlp_input, method)
        if kind == "dense":
            return self._dense_terms(layer, mlp_input, method)
        terms = self._embed_terms(method)
        for l in range(layer):
            terms += [self._sublayer(l, "attn", method), self._sublayer(l, "mlp", method)]
        if mlp_input:
            terms.append(self._sublayer(layer, "attn", method))
        return terms

    def _routed_terms(self, layer: int, mlp_input: bool, method: str) -> list[_Term]:
        """A depth read h = Σ_s α_s o_s (docs/definitions.md#depth-routing): each source times its weight at the read
        site; a block source (block routing) is its sub-layer outputs, each times α_block · the block mean's factor."""
        n = self.n_layers
        if mlp_input:
            site, written = names.read_site(layer, "mlp"), 2 * layer + 1
        elif layer == n:
            site, written = names.read_site(None), 2 * n
        elif layer == 0:
            return self._embed_terms(method)  # the first read site is the embedding itself
        else:
            site, written = names.read_site(layer, "attn"), 2 * layer
        alpha = self._need(names.depth_weights(site), method)  # …,T,S
        terms = []
        for s, label in enumerate(self.info.extra["depth_sites"][site]):
            if label == "embed":
                terms += self._embed_terms(method, alpha[..., s])
                continue
            members = self._source_members(label, written)
            factor = 1.0 if label.startswith(("attn", "mlp")) else self.model.depth_block_factor(len(members))
            terms += [self._sublayer(l, kind, method, alpha[..., s] * factor) for l, kind in members]
        return terms

    def _source_members(self, label: str, written: int) -> list[tuple[int, str]]:
        """The sub-layer outputs (layer, kind) a source label stands for ('attn3', 'mlp0', 'block2', 'partial'), at a
        read site after ``written`` sub-layers (probe.models.depth.site_sources names them)."""
        order = [(i // 2, "attn" if i % 2 == 0 else "mlp") for i in range(written)]
        for kind in ("attn", "mlp"):
            if label.startswith(kind):
                return [(int(label[len(kind) :]), kind)]
        size = 2 * self.n_layers // self.info.depth_blocks  # sub-layer outputs per block
        if label == "partial":
            return order[(written // size) * size :]
        block = int(label[len("block") :])
        return order[(block - 1) * size : block * size]

    def _dense_terms(self, layer: int, mlp_input: bool, method: str) -> list[_Term]:
        """A dense model's stream unrolled to its terms: block state X_0 is the embedding and X_{l+1} = resid_pre_l +
        attn_out_l + mlp_out_l; the stream after block l is Σ_s A_l[s] X_s, A_l the residual stream's weights in
        ``blocks.{l}.dense.hook_weights`` (its last stream: MUDD's q, k, v streams feed attention, not the stream)."""
        states: list[dict] = [{"embed": 1.0}]  # each block state's coefficients over the terms
        stream: dict = {"embed": 1.0}
        for l in range(layer):
            states.append({**stream, (l, "attn"): 1.0, (l, "mlp"): 1.0})
            stream = _combine(self._need(names.dense(l), method)[..., -1, :], states)  # …,T,S over X_0 .. X_{l+1}
        if mlp_input:
            stream[(layer, "attn")] = 1.0
        terms = []
        for key, coef in stream.items():
            if key == "embed":
                terms += self._embed_terms(method, coef)
            else:
                layer_of, kind = key
                terms.append(self._sublayer(layer_of, kind, method, coef))
        return terms

    def _final_stream(self, method: str) -> torch.Tensor:
        """What the final norm reads (…,T,d): the last resid_post (a depth-routed model's: the final read), on a
        dense model the last mix of the block states, on a hyper-connected one the head's collapse of the streams,
        on Gemma 3n (AltUp) the mean of its streams projected back, read off the final norm as normalized · scale."""
        last = self.n_layers - 1
        kind = self._stream_kind()
        if kind == "streams":
            return self._collapsed_streams(method)
        if self.info.extra.get("altup_streams"):  # an RMSNorm: normalized = x / scale
            normalized = self._need(names.LN_FINAL_NORMALIZED, method)
            return normalized * self._need(names.LN_FINAL_SCALE, method).to(normalized.dtype)
        if kind != "dense":
            return self._need(names.resid(last, "post"), method)
        embed = sum(t.value for t in self._embed_terms(method))
        states = torch.stack([embed] + [self._need(names.resid(l, "post"), method) for l in range(last + 1)], -2)
        mix = self._need(names.dense(last), method)[..., -1, :]  # …,T,S
        return (states * mix.to(states.dtype)[..., None]).sum(-2)

    def _collapsed_streams(self, method: str) -> torch.Tensor:
        """Σ_k head_k · stream_k (…,T,d): the streams after the last block (its MLP connection's write, H_res ·
        streams_mid + H_post ⊗ mlp_out, rebuilt from the hooks) collapsed by hc_head.hook_pre, what the final norm
        reads; the streams' sum where the head weighs each 1 (HC)."""
        last = self.n_layers - 1
        mid = self._need(names.streams(last, "mid"), method)  # …,T,n,d
        res, post = (self._need(names.hc(last, "mlp", p), method) for p in ("res", "post"))  # …,T,n,n out × in; …,T,n
        out = self._need(names.sublayer_out(last, "mlp"), method)  # …,T,d
        head = self._need(names.hyper_head(), method)  # …,T,n
        wide = torch.promote_types(mid.dtype, torch.float32)
        streams = HyperConnection.write(mid.to(wide), out.to(wide), (post, res))
        return read_streams(head.to(wide), streams).to(mid.dtype)

    def _stream(self, layer: int, mlp_input: bool, method: str) -> tuple[str, torch.Tensor]:
        """(its name, the stream) before block ``layer`` (before its MLP with ``mlp_input``; n_layers: the final)."""
        if layer == self.n_layers:
            return "the final stream", self._final_stream(method)
        pre = names.resid(layer, "pre")
        if not mlp_input:
            return pre, self._need(pre, method)
        mid = names.resid(layer, "mid")
        if dict.__contains__(self, mid) or self._stream_kind() != "residual":
            return mid, self._need(mid, method)
        # HF's own layer forward hides resid_mid (the generic route): resid_pre + attn_out is its definition
        return f"{pre} + attn_out", self._need(pre, method) + self._need(names.sublayer_out(layer, "attn"), method)

    def _check_sum(self, parts: list[torch.Tensor], layer: int, mlp_input: bool, method: str) -> None:
        """Refuse a decomposition whose terms do not add up to the stream (post-norm, a term missing from the cache)."""
        name, stream = self._stream(layer, mlp_input, method)
        total = torch.stack(parts).sum(0).double()
        if not _close(total, stream):
            error = float((total - stream.double()).norm() / stream.double().norm().clamp_min(1e-300))
            raise CacheError(
                f"{method}: its {len(parts)} terms do not sum to {name} (relative difference {error:.2g}): "
                + self._culprit(method)
            )

    def _culprit(self, method: str) -> str:
        """Why a stream is not the sum of its terms, as far as the cache can tell."""
        embed = sum(t.value for t in self._embed_terms(method)).double()
        first = self._need(names.resid(0, "pre"), method)
        if self._stream_kind() == "residual" and not _close(embed, first):
            start = f"{names.EMBED} (+ {names.pos_embed()})"
            return f"{start} is not {names.resid(0, 'pre')} (a position embedding not cached?)"
        return "a block normalises its stream after the residual add (post-norm), or a term is not in the cache"

    # ---- TransformerLens's stacks -------------------------------------------------------------------------
    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: str = "all",
        apply_ln: bool = False,
        pos_slice=None,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ):
        """The stream before block ``layer`` (None / -1 / n_layers: the final stream; with ``mlp_input`` before its
        MLP) as a stack of its terms (components, …,T,d; module docstring), TransformerLens's labels: 'embed',
        'pos_embed', '{l}_attn_out', '{l}_mlp_out'. ``mode`` 'attn' / 'mlp' keeps those outputs only, ``incl_embeds``
        the embedding terms. The full stack sums to the stream (checked; a failure is one line). ``apply_ln``: through
        that block's norm (the final norm) at its cached scale, times its gain (``apply_ln_to_stack``)."""
        if mode not in ("all", "attn", "mlp"):
            raise CacheError(f"decompose_resid: mode {mode!r}; choose 'all', 'attn' or 'mlp'")
        layer = self._layer(layer)
        if mlp_input and layer == self.n_layers:
            raise CacheError("decompose_resid: mlp_input needs a block layer (0 .. n_layers - 1)")
        terms = self._terms(layer, mlp_input, "decompose_resid")
        parts = [t.tensor() for t in terms]
        self._check_sum(parts, layer, mlp_input, "decompose_resid")
        keep = [i for i, t in enumerate(terms) if (incl_embeds if t.kind == "embed" else mode in ("all", t.kind))]
        pos_slice = _slice(pos_slice)
        like = pos_slice.apply(parts[0], dim=-2)
        kept = [pos_slice.apply(parts[i], dim=-2) for i in keep]
        stack = torch.stack(kept) if kept else like.new_zeros((0, *like.shape))
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice=pos_slice)
        labels = [terms[i].label for i in keep]
        return (stack, labels) if return_labels else stack

    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        pos_slice=None,
        mlp_input: bool = False,
        return_labels: bool = False,
    ):
        """The stream before each block up to ``layer`` (labels '{l}_pre', with ``incl_mid`` '{l}_mid' too; None /
        -1 / n_layers adds 'final_post', what the final norm reads), stacked: TransformerLens's. On a hyper-connected
        model each '{l}_pre' / '{l}_mid' is the streams' sum (hook_resid_pre / mid) and 'final_post' the head's
        collapse of the last streams (hc_head.hook_pre), so the logit lens ends on the logits. ``apply_ln`` at the
        final layer: each entry through the final norm with its own statistics, weight and bias (the logit lens;
        TransformerLens's ``recompute_ln``); at a block layer: through that block's norm at its cached scale, weight
        and bias included (TransformerLens stops at the scale there: ``apply_ln_to_stack(..., affine="none")``)."""
        layer, method = self._layer(layer), "accumulated_resid"
        if mlp_input and layer == self.n_layers:
            raise CacheError(f"{method}: mlp_input needs a block layer (0 .. n_layers - 1)")
        parts, labels = [], []
        for l in range(layer + 1):
            if l == self.n_layers:
                parts.append(self._final_stream(method))
                labels.append("final_post")
                continue
            parts.append(self._need(names.resid(l, "pre"), method))
            labels.append(f"{l}_pre")
            if (incl_mid and l < layer) or (mlp_input and l == layer):
                parts.append(self._need(names.resid(l, "mid"), method))
                labels.append(f"{l}_mid")
        pos_slice = _slice(pos_slice)
        stack = torch.stack([pos_slice.apply(p, dim=-2) for p in parts])
        if apply_ln:
            final = layer == self.n_layers
            stack = self.apply_ln_to_stack(
                stack, layer, mlp_input, pos_slice=pos_slice, recompute_ln=final, affine="full"
            )
        return (stack, labels) if return_labels else stack

    def apply_ln_to_stack(
        self,
        residual_stack: torch.Tensor,
        layer: int | None = None,
        mlp_input: bool = False,
        pos_slice=None,
        batch_slice=None,
        has_batch_dim: bool = True,
        recompute_ln: bool = False,
        affine: str = "weight",
    ) -> torch.Tensor:
        """Each entry of a stack (K,…,T,d; ``pos_slice`` / ``batch_slice`` already applied to it) as a part of a
        norm's input: the final norm (``layer`` None / -1 / n_layers) or block ``layer``'s ln1 (ln2 with
        ``mlp_input``). Centred for a LayerNorm, divided by the norm's cached ``hook_scale`` (with ``recompute_ln``
        at the final norm: each entry's own scale, as the norm would compute it were that entry the stream), then
        ``affine``: "none" (TransformerLens's value), "weight" (times the gain: a part's share of the norm's output,
        the bias left out) or "full" (the norm's output: gain and bias). A block without that norm (post-norm; a
        parallel block's MLP, which reads ln1's output) is one line."""
        if affine not in AFFINES:
            raise CacheError(f"apply_ln_to_stack: affine {affine!r}; choose from {', '.join(AFFINES)}")
        layer = self._layer(layer)
        final = layer == self.n_layers
        if mlp_input and final:
            raise CacheError("apply_ln_to_stack: the final norm has no MLP input (mlp_input needs a block layer)")
        pos_slice, batch_slice = _slice(pos_slice), _slice(batch_slice)
        if has_batch_dim:
            residual_stack = batch_slice.apply(residual_stack, dim=1)
        where, which = (None if final else layer), ("ln2" if mlp_input else "ln1")
        norm = self._norm(where, which)
        if recompute_ln and final:
            normalized = norm.normalize(residual_stack)
        else:
            scale = pos_slice.apply(self._cached_scale(where, which, norm), dim=-2)
            if self.has_batch_dim:
                scale = batch_slice.apply(scale)
            normalized = norm.normalize(residual_stack, scale)
        return normalized if affine == "none" else norm.affine(normalized, bias=affine == "full")

    def _norm(self, layer: int | None, which: str) -> NormAffine:
        """The norm (final: layer None) as the model's module computes it, described once per cache."""
        if (layer, which) not in self._norms:
            where = "the final norm" if layer is None else f"block {layer}'s {which}"
            module = self.model.norm_module(layer, which)
            if module is None:
                raise CacheError(
                    f"apply_ln_to_stack: {self.info.name} has no {where} (a post-norm block normalises its "
                    "sub-layers' outputs, not their input; a parallel block's MLP reads ln1's output)"
                )
            self._norms[layer, which] = describe_norm(module, f"{self.info.name}: {where}")
        return self._norms[layer, which]

    def _cached_scale(self, layer: int | None, which: str, norm: NormAffine) -> torch.Tensor:
        """The norm's cached hook_scale, checked once to be the scale of the stream a stack at this norm is part of
        (the final stream; the stream before block ``layer``, or before its MLP for ln2): MUDD's ln1 reads its query
        stream and a parallel block's MLP norm the block's input, where a stack of the other would be a wrong number."""
        method, key = "apply_ln_to_stack", names.norm(layer, which, "scale")
        scale = self._need(key, method)
        if key not in self._scales_checked:
            name, stream = self._stream(self.n_layers if layer is None else layer, which == "ln2", method)
            if not _close(norm.scale(stream.double()), scale):
                raise CacheError(
                    f"{method}: {key} is not the scale of {name}: that norm reads another stream (MUDD's query "
                    "stream; a hyper-connected block's H_pre read of its streams, not their sum; a parallel block's "
                    "MLP norm reads the block's input, not resid_mid)"
                )
            self._scales_checked.add(key)
        return scale

    def stack_head_results(
        self,
        layer: int = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice=None,
        apply_ln: bool = False,
    ):
        """Each head's write (``blocks.{l}.attn.hook_result``, z_h W_O[h]) of every block before ``layer``, stacked
        (l·H,…,T,d; labels 'L{l}H{h}'), times its attention output's coefficient in the stream before ``layer`` (1 on a
        residual stream; a depth-routed or dense model's read weights, as ``decompose_resid``'s terms; a
        hyper-connected model's streams are no such sum: one line); ``incl_remainder`` adds the stream before
        ``layer`` less their sum (the embedding, the MLPs, the output biases). Summed over a layer's heads plus b_O:
        its hook_attn_out (its term). A layer without softmax heads (linear attention) is one line, as is a cache
        without hook_result."""
        layer, method = self._layer(layer), "stack_head_results"
        pos_slice = _slice(pos_slice)
        coefs = self._attn_coefficients(layer, method)
        heads, labels = [], []
        for l in range(layer):
            result = self._need(names.attn(l, "result"), method)  # …,T,H,d
            self._check_heads(l, result, method)
            coef = coefs.get(l, 0.0)  # a float, or per position …,T
            if isinstance(coef, torch.Tensor):
                result = result * coef.to(result.dtype)[..., None, None]
            elif coef != 1.0:
                result = result * coef
            heads.append(pos_slice.apply(result, dim=-3))
            labels += [f"L{l}H{h}" for h in range(result.shape[-2])]
        if heads:
            stack = torch.cat(heads, dim=-2).movedim(-2, 0)  # (l·H),…,T,d
        else:
            like = pos_slice.apply(self._need(names.EMBED, method), dim=-2)
            stack = like.new_zeros((0, *like.shape))
        if incl_remainder:
            rest = pos_slice.apply(self._stream(layer, False, method)[1], dim=-2) - stack.sum(0)
            stack, labels = torch.cat([stack, rest[None]]), labels + ["remainder"]
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def _attn_coefficients(self, layer: int, method: str) -> dict[int, torch.Tensor | float]:
        """Block l's attention output's coefficient in the stream before ``layer`` (decompose_resid's term's)."""
        if self._stream_kind() == "residual":
            return dict.fromkeys(range(layer), 1.0)
        coefs: dict[int, torch.Tensor | float] = {}
        for term in self._terms(layer, False, method):
            if term.kind == "attn":
                l = int(term.label.split("_")[0])
                coefs[l] = coefs.get(l, 0.0) + term.coef
        return coefs

    def _check_heads(self, layer: int, result: torch.Tensor, method: str) -> None:
        """Refuse heads whose writes are not what the layer adds to the stream: a norm on the attention's output
        (ln1_post), or hook_attn_out less their sum not one vector (b_O) at every position (a multiplier on the
        output: Granite's residual scale)."""
        if self.model.norm_module(layer, "ln1_post") is not None:
            raise CacheError(
                f"{method}: layer {layer}'s attention output passes a norm (ln1_post: sandwich or post-norm) before "
                "the stream, so a head's write is not a stream component"
            )
        out = self._need(names.sublayer_out(layer, "attn"), method)
        rest = (out.double() - result.double().sum(-2)).reshape(-1, out.shape[-1])  # b_O at every position
        if not _close(rest[:1].expand_as(rest) + result.double().sum(-2).reshape(rest.shape), out.reshape(rest.shape)):
            raise CacheError(
                f"{method}: layer {layer}'s heads do not sum to its hook_attn_out up to one bias vector: its attention "
                "output passes a norm or a multiplier before the stream, so a head's write is not a stream component"
            )

    # ---- into the vocabulary ------------------------------------------------------------------------------
    def logit_attrs(
        self,
        residual_stack: torch.Tensor,
        tokens,
        incorrect_tokens=None,
        pos_slice=None,
        batch_slice=None,
        has_batch_dim: bool = True,
    ) -> torch.Tensor:
        """Each stack entry's direct share of the logit of ``tokens`` (minus ``incorrect_tokens``'), TransformerLens's
        shapes: the entry through the final norm at its cached scale times its gain (``apply_ln_to_stack``), dotted
        with the tokens' rows of the LM head. Over a full ``decompose_resid()`` the shares sum to the logit less the
        constant the norm's bias and the LM head's bias add. A soft-capped head (Gemma 2) is refused: its logit is
        cap · tanh(z / cap), not a sum of parts."""
        unembedding = self._linear_unembedding("logit_attrs")
        directions = self._directions(unembedding, tokens)
        if incorrect_tokens is not None:
            if _token_shape(tokens) != _token_shape(incorrect_tokens):
                raise CacheError("logit_attrs: tokens and incorrect_tokens must have the same shape")
            directions = directions - self._directions(unembedding, incorrect_tokens)
        scaled = self.apply_ln_to_stack(
            residual_stack, None, pos_slice=pos_slice, batch_slice=batch_slice, has_batch_dim=has_batch_dim
        )
        batch_slice = _slice(batch_slice)
        per_example = directions.ndim == 2 and scaled.ndim == 4 and directions.shape[0] == scaled.shape[1]
        if has_batch_dim and batch_slice.mode != "int" and per_example:
            directions = directions.unsqueeze(-2)  # one token per example, the same at every position (as TL)
        try:
            torch.broadcast_shapes(scaled.shape[1:-1], directions.shape[:-1])
        except RuntimeError:
            sink = "; a sink-token model's cache has T + 1 positions, position 0 its learned sink token" * bool(
                self.info.sink_token
            )
            raise CacheError(
                f"logit_attrs: tokens of shape {tuple(directions.shape[:-1])} do not match the stack's positions "
                f"{tuple(scaled.shape[1:-1])}{sink}"
            ) from None
        return (scaled * directions.to(scaled)).sum(-1)

    def logit_lens(self, layer: int | None = None, apply_ln: bool = True, pos_slice=None, return_labels: bool = False):
        """The logit lens (K,…,T,V): ``accumulated_resid(layer)``'s streams, each through the final norm with its own
        statistics (``apply_ln``; the norm's weight and bias included) and the model's ``unembed`` (its LM head and any
        final soft-cap). The 'final_post' entry is the model's logits (a sink-token model's at positions 1 …)."""
        stack, labels = self.accumulated_resid(layer, pos_slice=pos_slice, return_labels=True)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, None, recompute_ln=True, affine="full")
        logits = self.model.unembed(stack)
        return (logits, labels) if return_labels else logits

    def source_lens(self, pos_slice=None, return_labels: bool = False):
        """What each term of the final stream predicts on its own (S,…,T,V; ``decompose_resid()``'s labels).

        The final stream is h = Σ_s c_s o_s over its terms o_s (the embedding, each sub-layer's output) with
        coefficients c_s (module docstring): on a depth-routed model (AttnRes, S-LR, P-LR) c_s is the final read's
        depth weight α_s (``final_read.hook_depth_weights``; for a member of a block source, α_block times the block
        mean's factor), on a dense model (DenseFormer, MUDD) its unrolled mixing weight, on a plain residual stream 1.
        Source s's lens is W_U · (g ⊙ (c_s o_s − centre(c_s o_s)) / σ), σ the final norm's cached scale of h
        (``ln_final.hook_scale``: the read's own, shared by every source), g its gain and centre the mean for a
        LayerNorm (0 for an RMSNorm): the source's direct share of each logit. Σ_s lens_s = logits − W_U·b − b_U
        (the norm's and the head's biases); a soft-capped head is refused (not additive)."""
        unembedding = self._linear_unembedding("source_lens")
        stack, labels = self.decompose_resid(None, apply_ln=True, pos_slice=pos_slice, return_labels=True)
        lens = stack @ unembedding.weight.to(stack).T
        return (lens, labels) if return_labels else lens

    def _linear_unembedding(self, method: str) -> Unembedding:
        """The LM head, checked to be what ``model.unembed`` applies, and linear (no soft-cap)."""
        unembedding = self.model.unembedding()
        if unembedding.softcap:
            raise CacheError(
                f"{method}: {self.info.name} soft-caps its logits (cap * tanh(z / cap), cap {unembedding.softcap}): a "
                "logit is not a sum of per-component parts, so there is no additive attribution"
            )
        weight = unembedding.weight
        probe = torch.randn(2, weight.shape[-1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        probe = probe.to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            got = self.model.unembed(probe).double()
            want = probe.double() @ weight.double().T
            want = want if unembedding.bias is None else want + unembedding.bias.double()
        error = float((got - want).norm() / want.norm().clamp_min(1e-300))
        if not error <= _tolerance(weight.dtype, NORM_TOLERANCE, HALF_NORM_TOLERANCE):
            raise CacheError(
                f"{method}: {self.info.name}'s unembed is not its LM head's weight and bias alone (relative difference "
                f"{error:.2g}), so its logits are not the linear read this attribution assumes"
            )
        return unembedding

    def _directions(self, unembedding: Unembedding, tokens) -> torch.Tensor:
        """The LM head's rows of ``tokens`` (TransformerLens's ``tokens_to_residual_directions``): tokens.shape + (d,)
        for a tensor of several, (d,) for one token (a string, an int or a one-element tensor)."""
        if isinstance(tokens, torch.Tensor) and tokens.numel() > 1:
            return unembedding.weight[tokens.to(unembedding.weight.device)]
        if isinstance(tokens, str):
            token = self.model.to_single_token(tokens)
        elif isinstance(tokens, int):
            token = tokens
        elif isinstance(tokens, torch.Tensor):
            token = int(tokens.item())
        else:
            raise CacheError(
                f"logit_attrs: tokens are a string, an int or a tensor of ids, got {type(tokens).__name__}"
            )
        return unembedding.weight[token]


# TransformerLens methods that read HookedTransformer's weights by its own names (W_out, W_O, blocks[l].mlp, SSM
# mixers): refused in one line rather than failing inside on a missing attribute
_NOT_HERE = {
    "get_full_resid_decomposition": "it expands MLP neurons through HookedTransformer's W_out; use decompose_resid "
    "or stack_head_results",
    "get_neuron_results": "it reads HookedTransformer's W_out",
    "stack_neuron_results": "it reads HookedTransformer's W_out",
    "compute_head_results": "run_with_cache caches each softmax layer's per-head results (hook_result) already",
    "ssm_layers": "probe's models name no SSM mixers (a linear layer's type is in probe_info.layer_types)",
    "compute_ssm_effective_attention": "it reads TransformerBridge's SSM mixers",
    "compute_ssm_state": "it reads TransformerBridge's SSM mixers",
}
for _method, _why in _NOT_HERE.items():
    setattr(ActivationCache, _method, _refusal(_method, _why))


def _close(total: torch.Tensor, stream: torch.Tensor) -> bool:
    """Whether a sum of terms is the stream up to the rounding of the stream's dtype (relative, over the tensor)."""
    error = (total.double() - stream.double()).norm() / stream.double().norm().clamp_min(1e-300)
    return bool(error <= _tolerance(stream.dtype, SUM_TOLERANCE, HALF_SUM_TOLERANCE))


def _slice(value) -> Slice:
    return value if isinstance(value, Slice) else Slice(value)


def _token_shape(tokens) -> tuple:
    return tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else ()


def _combine(weights: torch.Tensor, states: list[dict]) -> dict:
    """Σ_s weights[…, s] · states[s] over coefficient dicts (term -> 1.0 or a …,T tensor), terms in first-seen order."""
    out: dict = {}
    for s, state in enumerate(states):
        for key, coef in state.items():
            part = weights[..., s] * coef
            out[key] = part if key not in out else out[key] + part
    return out
