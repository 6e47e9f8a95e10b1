"""``HookedHF``: a TransformerLens ``HookedRootModule`` around a transformers causal LM, exposing probe's hook names.

How the hooks fire (family adapters in ``probe.checkpoints.adapters`` fill in the per-architecture parts):

* ``hook_embed`` — a forward hook on the input embedding returns ``hook_embed(output)``.
* ``blocks.{l}.hook_resid_pre / hook_resid_mid / hook_resid_post`` — each decoder layer's ``forward`` is replaced
  (on that instance only) by the family's layer forward, which calls the layer's own submodules in HF's order and
  passes the residual stream through the HookPoints, so edits propagate exactly.
* ``blocks.{l}.attn.*`` — the model runs with ``attn_implementation="probe"`` (``probe.checkpoints.attention``); the
  attention function looks up the calling module's hook container and fires hook_rot_q/rot_k/v/v_out/[sink_logit]/
  [attn_scores/pattern/phantom]/z; forward hooks on the attention module's own q_proj / k_proj, QK-norm and output
  projection fire hook_q/k, hook_q_normed/k_normed and hook_result (``_AttnHooks.attach``).

The HF model is ``self.hf_model``; ``self(input_ids)`` returns its output (``.logits``). ``run_with_cache``,
``run_with_hooks``, ``return_type=`` and ``to_tokens`` return what TransformerLens's do (``probe.models.lens``).
:func:`adapt` builds one on an HF model (in place), :func:`wrap` on a user's object without touching it
(TransformerBridge, nnsight model or plain HF model: a structural copy that shares the parameters).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import re
import sys
import types
import warnings
from abc import abstractmethod
from collections import OrderedDict

import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from probe.checkpoints import attention as _attn
from probe.checkpoints import module_hooks
from probe.hooks import names
from probe.hooks.info import ModelInfo
from probe.models.cache import Unembedding
from probe.models.inputs import hf_context_limit
from probe.models.lens import HF_OUTPUT, TransformerLensCalls


class _AttnHooks(nn.Module):
    def __init__(self, has_sink: bool, gated: bool = False):
        super().__init__()
        # an output gate (Qwen3-Next, AFMoE): the attention function leaves hook_z to the adapter's gate hooks;
        # query_gated: the gate comes out of q_proj beside each head's query (Qwen3-Next), not a projection of its own
        self.gated = gated
        self.query_gated = False
        self.pending_z = self.pending_gate = None
        self.pending_keys = None  # entries an adapter appends after the token keys: their bias (attention.py)
        self.materialize = False  # compute the pattern even when no TL hook asks (probe.materialize, for nnsight)
        # the layer and the ModelInfo that describe this attention: the attention function checks each call against
        # them (its scale, window and soft-cap as probe_info says now) and the heads it was built with
        self.layer: int | None = None
        self.info: ModelInfo | None = None
        self.heads: tuple[int, int, int] | None = None  # query heads, key/value heads, query-key head width
        # where hook_q / hook_k fire (probe.checkpoints.attention.qk_plan; None: nowhere) and the layer's rotary
        # tables T -> (cos, sin) for turning hook_rot_q back; set by attach
        self.qk_route: str | None = None
        self.rotary = None
        self.hook_rot_q = HookPoint()  # B,T,H,dh the query the scores take: after QK-norm and rotary
        self.hook_rot_k = HookPoint()  # B,T,Hkv,dh
        self.hook_v = HookPoint()  # B,T,Hkv,dh value reads
        self.hook_v_out = HookPoint()  # B,T,Hkv,dh value aggregated (== hook_v: HF models have no value gate)
        if has_sink:
            self.hook_sink_logit = HookPoint()  # H
        self.hook_attn_scores = HookPoint()  # B,H,Tq,Tk pre-softmax scores, hidden keys -inf (fired only when hooked)
        self.hook_pattern = HookPoint()  # B,H,Tq,Tk over real keys
        self.hook_phantom = HookPoint()  # B,H,Tq sink mass (zeros without a sink)
        self.hook_lse = HookPoint()  # B,H,Tq real-key log-normaliser (fired only when hooked)
        if gated:
            self.hook_out_gate = HookPoint()  # B,T,H,dh σ(gate) in [0, 1] on each head's output
        self.hook_z = HookPoint()  # B,T,H,dh before the output projection (gated where there is a gate)

    def attach(self, attn: nn.Module, rotary) -> set[str]:
        """Hook the HF attention module's own projections and QK-norm (probe.checkpoints.attention.qk_plan) and its
        output projection, creating the points they fire: hook_q / hook_k where the query and key before rotary can
        be read, hook_q_normed / hook_k_normed where there is a QK-norm before rotary, hook_result and
        hook_pattern_norm where there is an output projection. ``rotary``: T -> the layer's (cos, sin) tables, or
        None. Returns the attention points (names.ATTN_POINTS) this layer has but cannot fire (a layer without QK-norm
        has no hook_q_normed to lack)."""
        plan = _attn.qk_plan(attn, rotary is not None and rotary(1) is not None)
        self.qk_route, self.rotary = plan["route"], rotary
        out = _attn.out_projection(attn)
        fired = {
            "q": plan["route"] is not None,  # B,T,H,dh the projection's output
            "k": plan["route"] is not None,  # B,T,Hkv,dh
            "q_normed": plan["norms"] is not None,  # B,T,H,dh after QK-norm
            "k_normed": plan["norms"] is not None,  # B,T,Hkv,dh
            "result": out is not None,  # B,T,H,d each head's write through the output projection
            "pattern_norm": out is not None,  # B,H,Tq,Tk ||a_ij v_j W_O[h]||, read from the same projection
        }
        for point in (p for p, here in fired.items() if here):
            self.add_module(f"hook_{point}", HookPoint())
        _attn.install_qk_hooks(self, plan)
        self.__dict__["out_proj"] = out  # a plain attribute, not a submodule: read by hook_pattern_norm
        if out is not None:
            _attn.hook_module(out, self, "result", _attn.result_hook)
        return {p for p in ("q", "k", "result", "pattern_norm") if not fired[p]}


def attach_attention(adapter, layers) -> None:
    """Attach each softmax layer's hook container to its attention module's projections (``_AttnHooks.attach``) and
    list in ``ModelInfo.absent_hooks`` the points no layer fires (docs/definitions.md#hook-namespace)."""
    lacking = None
    for l, (layer, block) in enumerate(zip(layers, adapter.blocks)):
        if hasattr(block, "attn"):
            rotary = functools.partial(scaled_rotary, adapter, l)
            lacks = block.attn.attach(adapter.attention_module(layer), rotary)
            lacking = lacks if lacking is None else lacking & lacks
    absent = adapter.probe_info.absent_hooks
    below_block = (names.attn(0, p).split(".", 2)[-1] for p in sorted(lacking or ()))  # "attn.hook_q"
    absent += [point for point in below_block if point not in absent]


def scaled_rotary(adapter, layer: int, T: int):
    """The layer's rotary tables (``HookedHF.rotary_tables``) times its rotary's attention scaling (YaRN's mscale
    multiplies q and k after the rotation): (cos, sin) that turn hook_q into hook_rot_q, or None."""
    tables = adapter.rotary_tables(layer, T)
    if tables is None:
        return None
    base = getattr(adapter.hf_model.base_model, "language_model", adapter.hf_model.base_model)
    attn = adapter.attention_module(adapter.decoder_layers(adapter.hf_model)[layer])
    rope = getattr(attn, "rotary_emb", None) or getattr(base, "rotary_emb", None)
    scaling = float(getattr(rope, "attention_scaling", 1.0) or 1.0)
    return tables if scaling == 1.0 else (tables[0] * scaling, tables[1] * scaling)


class _BlockHooks(nn.Module):
    """One decoder layer's hook points. A point the adapter cannot fire is not created (``absent``: e.g.
    ``hook_resid_mid`` on the generic route), and a layer without softmax attention has no ``attn`` container, so a
    hook on such a name fails loudly instead of never firing. A linear-attention, convolution or recurrent layer whose
    forward the adapter replaces (``replaced``) is first-class in the stream: ``hook_attn_out`` is its token mixer's
    write and ``hook_resid_mid`` follows it, as on a softmax layer; only the ``attn.*`` points are absent."""

    def __init__(
        self,
        has_sink: bool,
        attention: bool = True,
        absent: frozenset[str] = frozenset(),
        gated: bool = False,
        replaced: bool = False,
    ):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        if attention:
            self.attn = _AttnHooks(has_sink, gated)
        if attention or replaced:  # a linear layer's mixer output, where the replaced layer forward sees it
            self.hook_attn_out = HookPoint()  # B,T,d what the attention (or token mixer) adds to the stream
        for point in ("hook_resid_mid", "hook_mlp_out"):  # B,T,d; what the MLP adds
            if point not in absent:
                setattr(self, point, HookPoint())
        self.hook_resid_post = HookPoint()


# replace a layer's forward only where the coverage table recorded its source (off while the table is regenerated)
VERIFY_LAYERS = True

LAYER_KEY = "_probe_block"  # HF decoder layer.__dict__ entry -> its _BlockHooks (not a registered submodule)
EMBED_KEY = "_probe_embed"  # input embedding.__dict__ entry -> the adapter's hook_embed
EMBED_SCALE_KEY = "_probe_embed_scale"  # input embedding.__dict__ entry -> the multiplier HF applies to its output
ATTN_OUT_KEY = "_probe_attn_out"  # attention module.__dict__ entry -> the _BlockHooks whose hook_attn_out it fires
MLP_OUT_KEY = "_probe_mlp_out"  # MLP module.__dict__ entry -> the _BlockHooks whose hook_mlp_out it fires


def embed_hook(module, _inputs, output):
    """Forward hook on the input embedding: returns hook_embed(output). Where HF multiplies the embedding's output
    next (Granite's ``embedding_multiplier``), hook_embed sees and sets the scaled stream the first block reads: the
    hook's value divided back, for HF to multiply again."""
    hp = module.__dict__.get(EMBED_KEY)
    if hp is None:
        return None
    scale = module.__dict__.get(EMBED_SCALE_KEY)
    return hp(output) if scale is None else hp(output * scale) / scale


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def _replace_first(output, value):
    return (value,) + tuple(output[1:]) if isinstance(output, tuple) else value


def attn_out_hook(module, _inputs, output):
    """Forward hook on a layer's attention module, on the generic route only (HF's own layer forward; a replaced
    layer forward fires hook_attn_out itself on what it adds): the module's output through ``hook_attn_out``; the
    attention weights it may also return pass unchanged. That output is what a pre-norm sequential layer adds to the
    stream; a layer that norms, drops or scales it before adding breaks resid_pre + attn_out + mlp_out = resid_post,
    and the algebra check (probe.checkpoints.algebra) says so."""
    block = module.__dict__.get(ATTN_OUT_KEY)
    return None if block is None else _replace_first(output, block.hook_attn_out(_first(output)))


def mlp_out_hook(module, inputs, output):
    """Forward hook on a layer's MLP module, on the generic route only (as :func:`attn_out_hook`): its output (an MoE
    block's combined output; router logits pass), as B,T,d even where the module hands it back flattened over
    positions (B*T, d)."""
    block = module.__dict__.get(MLP_OUT_KEY)
    if block is None:
        return None
    out, x = _first(output), inputs[0] if inputs else None
    if x is not None and out.dim() == 2 and x.dim() == 3 and out.numel() == x.numel():
        return _replace_first(output, block.hook_mlp_out(out.view(x.shape)).reshape(out.shape))
    return _replace_first(output, block.hook_mlp_out(out))


def resid_pre_hook(module, args, kwargs):
    """Forward pre-hook on a decoder layer whose forward stays HF's (the generic route): its input residual stream,
    the first positional argument or ``hidden_states=``, through ``hook_resid_pre``."""
    block = module.__dict__.get(LAYER_KEY)
    if block is None:
        return None
    if args:
        return (block.hook_resid_pre(args[0]),) + tuple(args[1:]), kwargs
    return args, {**kwargs, "hidden_states": block.hook_resid_pre(kwargs["hidden_states"])}


def resid_post_hook(module, _inputs, output):
    """Forward hook on a decoder layer (the generic route): its output residual stream through
    ``hook_resid_post``; what the next layer (or the final norm) reads is the hook's result."""
    block = module.__dict__.get(LAYER_KEY)
    return None if block is None else _replace_first(output, block.hook_resid_post(_first(output)))


# what a modeling file shows when its rotary is not rotate-half pairs over the leading coordinates of each layer's q, k:
# interleaved pairs (GPT-J, CodeGen, Cohere, GLM, ERNIE 4.5, Helium), a rotary part after a latent part (DeepSeek's
# latent attention and its kin), complex rotations (Llama 4), layers without rotary (SmolLM3, EXAONE 4, OLMo-hybrid)
NOT_HALF_ROTARY = ("rotate_every_two", "rope_interleave", "qk_rope_head_dim", "view_as_complex", "x[..., ::2]",
                   "x[..., 0::2]", "no_rope", "nope")  # fmt: skip


def rotates_halves(attn) -> bool:
    """Whether the attention module's modeling code rotates q and k as :meth:`HookedHF.rotary_tables` describes (read
    off its source: a family whose rotary differs gets no tables, so eviction at cache positions refuses it)."""
    module = inspect.getmodule(type(attn))
    try:
        source = inspect.getsource(module).lower() if module is not None else ""
    except (OSError, TypeError):
        return False
    return bool(source) and not any(mark in source for mark in NOT_HALF_ROTARY)


def hooked_layer_forward(self, hidden_states=None, *args, **kwargs):
    """Instance forward installed on HF decoder layers: the family's hooked body (``block.body``).

    The hook container is found in the layer's ``__dict__`` rather than a global registry, so ``copy.deepcopy`` of
    an adapter yields a working adapter whose copied layers fire the copied HookPoints.
    """
    block = self.__dict__.get(LAYER_KEY)
    if block is None:
        return type(self).forward(self, hidden_states, *args, **kwargs)
    if args:  # GPT-2's model passes its cache and mask positionally: name them as HF's layer forward does
        kwargs = _as_keywords(type(self).forward, self, hidden_states, args, kwargs)
    return block.body(self, block, hidden_states, **kwargs)


# forwards adapters install on HF module instances (a structural copy drops them: they are bound to the original)
INSTANCE_FORWARDS = {hooked_layer_forward}


def _as_keywords(forward, layer, hidden_states, args, kwargs) -> dict:
    """The arguments after the hidden states of a layer call, all by keyword, named by HF's layer signature."""
    signature = inspect.signature(forward)
    out = {}
    for name, value in list(signature.bind(layer, hidden_states, *args, **kwargs).arguments.items())[2:]:
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        else:
            out[name] = value
    return out


class HookedHF(TransformerLensCalls, HookedRootModule):
    """Base adapter. Subclasses set ``family`` and ``model_types``, implement :meth:`describe` and, where the
    generic lookups do not fit, :meth:`decoder_layers`, :meth:`attention_module` and :meth:`mlp_module`. A family
    whose layer the hooks must see inside (``hook_resid_mid``, parallel blocks) sets ``layer_forward``, its hooked
    copy of HF's layer body; without one, HF's own layer forward runs and module hooks fire ``hook_resid_pre`` /
    ``hook_resid_post`` around it (the generic route)."""

    family = "hf"
    model_types: tuple[str, ...] = ()
    has_sink = False
    layer_forward = None  # staticmethod (layer, hooks: _BlockHooks, hidden_states, **kwargs) -> hidden_states
    uses_attention_interface = True  # the attention modules call transformers' attention interface

    def __init__(self, hf_model: nn.Module, tokenizer=None, name: str | None = None):
        super().__init__()
        self.hf_model = hf_model
        self.tokenizer = tokenizer
        layers = list(self.decoder_layers(hf_model))
        self.has_sink = self.sink_in(layers)
        self.layer_body = self.body_for(layers)
        self.probe_info: ModelInfo = self.describe(hf_model.config, name or _default_name(hf_model))
        info = self.probe_info
        drop_unread_keys(info, hf_model, layers, self.attention_module)
        fp64_experts(hf_model)
        if self.layer_body is None and "hook_resid_mid" not in info.absent_hooks:
            info.absent_hooks.append("hook_resid_mid")  # HF's own layer forward: the mid stream is a local of it
        self.hook_embed = HookPoint()
        absent = frozenset(info.absent_hooks)
        self.blocks = nn.ModuleList(
            [
                _BlockHooks(self.has_sink, kind != "linear", absent, info.has_out_gate, self.layer_body is not None)
                for kind in info.layer_types[: len(layers)]
            ]
        )
        self._install(layers)
        self.setup()
        self._expect(layers)
        self.eval()

    # --- per family ------------------------------------------------------------------------------------------
    @staticmethod
    def embedding_module(hf_model) -> nn.Module:
        """The module whose output is the stream the first block reads (with learned positions added after it):
        the input embedding, or a family's norm on it (BLOOM); hook_embed fires on its output."""
        return hf_model.get_input_embeddings()

    @staticmethod
    def decoder_layers(hf_model) -> list[nn.Module]:
        return list(hf_model.model.layers)

    @staticmethod
    def attention_module(layer) -> nn.Module | None:
        return layer.self_attn

    @staticmethod
    def mlp_module(layer) -> nn.Module | None:
        return getattr(layer, "mlp", None)

    def body_for(self, layers):
        """The hooked layer body to install (``layer_forward``), or None for HF's own forward with module hooks. A
        family's body replaces HF's layer forward only where the coverage table records that layer's source as the
        one its parity tests passed on (``probe.checkpoints.adapters.recipes.layer_source_hash``): a layer that
        transformers changed since runs unreplaced, without hook_resid_mid, rather than as a stale copy."""
        body = type(self).layer_forward
        if body is None or not layers or not VERIFY_LAYERS:
            return body
        from probe.checkpoints.architectures import record

        config = self.hf_model.config
        found_record = record(config.model_type) or record(config.get_text_config().model_type) or {}
        recorded = found_record.get("layer_hash")
        found = layer_source_hash(layers[0])
        if recorded and found and recorded != found:
            warnings.warn(
                f"transformers' {type(layers[0]).__name__} is not the layer probe's {self.family} adapter was "
                f"checked on (source {found}, checked {recorded}); its own forward runs, without hook_resid_mid",
                stacklevel=3,
            )
            return None
        return body

    def attention_implementation(self) -> str:
        """The transformers attention implementation the model runs: probe's ("probe"; Gemma's families pick the
        soft-capped one where their config caps the scores)."""
        return _attn.register()

    def sink_in(self, layers) -> bool:
        """Whether the layers' attention has a learned sink logit: the family's ``has_sink``, or gpt-oss style
        ``sinks`` on an attention module of any layer."""
        found = (self.attention_module(layer) for layer in layers)
        return type(self).has_sink or any(isinstance(getattr(a, "sinks", None), nn.Parameter) for a in found)

    @abstractmethod
    def describe(self, config, name: str) -> ModelInfo:
        """Each family's adapter describes its architecture as a ModelInfo."""
        raise NotImplementedError  # abstractmethod: every adapter defines it

    # --- machinery --------------------------------------------------------------------------------------------
    def _install(self, layers):
        hf = self.hf_model
        if self.uses_attention_interface:
            hf.set_attn_implementation(self.attention_implementation())
        else:  # attention outside the interface (BLOOM, GPT-Neo): only the mask builder is probe's
            hf.config._attn_implementation = _attn.register()
        embedding = self.embedding_module(hf)
        _hook_once(embedding, EMBED_KEY, self.hook_embed, embed_hook)
        scale = getattr(hf.base_model, "embedding_multiplier", None)  # Granite: the model scales embed_tokens' output
        if isinstance(scale, (int, float)) and scale not in (0, 1):
            embedding.__dict__[EMBED_SCALE_KEY] = float(scale)
        body = self.layer_body
        for layer, block in zip(layers, self.blocks):
            layer.__dict__[LAYER_KEY] = block
            attn, mlp = self.attention_module(layer), self.mlp_module(layer)
            if hasattr(block, "attn"):
                attn.__dict__[_attn.SITE_KEY] = block.attn
            # a replaced layer forward fires hook_attn_out / hook_mlp_out on what it adds to the stream (after any
            # output norm, dropout or multiplier); HF's own forward leaves only the modules' outputs to hook
            if body is None and hasattr(block, "attn"):
                _hook_once(attn, ATTN_OUT_KEY, block, attn_out_hook)
            if body is None and mlp is not None and hasattr(block, "hook_mlp_out"):
                _hook_once(mlp, MLP_OUT_KEY, block, mlp_out_hook)
            if body is not None:
                block.body = body
                layer.forward = types.MethodType(hooked_layer_forward, layer)
            else:
                if resid_pre_hook not in layer._forward_pre_hooks.values():
                    layer.register_forward_pre_hook(resid_pre_hook, with_kwargs=True)
                if resid_post_hook not in layer._forward_hooks.values():
                    layer.register_forward_hook(resid_post_hook)
        attach_attention(self, layers)  # the attention modules' projections and QK-norm: hook_q/k, hook_result
        module_hooks.install(self, layers)  # norms, MLP, router, positions, unembedding (module_hooks.py)

    def _expect(self, layers):
        """Tell each layer's hook container what probe_info says its attention is (checked on every call), and
        record the scale the attention modules use where the family did not (``extra["attn_scale"]``)."""
        info = self.probe_info
        attns = [self.attention_module(layer) for layer, kind in zip(layers, info.layer_types) if kind != "linear"]
        groups = getattr(attns[0], "num_key_value_groups", None) if attns else None
        kv_heads = None  # GPT-BigCode's kv_heads, Falcon's num_kv_heads: multi-query attention
        for name in ("kv_heads", "num_kv_heads", "num_key_value_heads"):
            kv_heads = kv_heads or (getattr(attns[0], name, None) if attns else None)
        if isinstance(groups, int) and groups > 0 and info.n_heads % groups == 0:
            info.n_kv_heads = info.n_heads // groups
        elif isinstance(kv_heads, int) and kv_heads > 0:
            info.n_kv_heads = kv_heads
        if "attn_scale" not in info.extra:
            scales = [getattr(self.attention_module(layer), "scaling", None) for layer in layers]
            scales = [info.d_head**-0.5 if s is None else float(s) for s in scales]  # (a linear layer's is unused)
            info.extra["attn_scale"] = scales[0] if len(set(scales)) == 1 else scales
        for l, block in enumerate(self.blocks):
            if not hasattr(block, "attn"):
                continue
            block.attn.layer, block.attn.info = l, info
            width = getattr(self.attention_module(layers[l]), "head_dim", None)  # Gemma 4: wider full layers
            block.attn.heads = (info.n_heads, info.n_kv_heads, width if isinstance(width, int) else info.d_head)

    def setup(self):
        """TransformerLens setup over the hook tree only (the wrapped HF modules are not renamed or listed)."""
        self.mod_dict, self.hook_dict = {}, {}
        for name, module in self.named_modules():
            if name == "" or name == "hf_model" or name.startswith("hf_model."):
                continue
            module.name = name
            self.mod_dict[name] = module
            if isinstance(module, HookPoint):
                self.hook_dict[name] = module

    @property
    def materialize_patterns(self) -> bool:
        """Force the pattern path (hook_pattern/hook_phantom fire on every forward), e.g. to read patterns through
        nnsight, which does not register TransformerLens hooks. Off by default: patterns are then computed only when
        a hook or cache asks for them. The same switch as ``with probe.materialize(model):``, kept as a property."""
        return all(b.attn.materialize for b in self.blocks if hasattr(b, "attn"))

    @materialize_patterns.setter
    def materialize_patterns(self, on: bool):
        for b in self.blocks:
            if hasattr(b, "attn"):
                b.attn.materialize = bool(on)

    def forward(
        self, input_ids=None, attention_mask=None, return_hidden: bool = False, return_type=HF_OUTPUT, **kwargs
    ):
        """Run the HF model (``use_cache=False`` unless given); ``input_ids`` may also be a string or a list of
        strings (:meth:`to_tokens`, the BOS rule). With ``return_hidden`` the decoder alone runs and its final-normed
        hidden states B,T,d come back, for :meth:`unembed` (analyses unembed a few positions at a time: Gemma's 262k
        vocabulary makes full logits of 8 x 1024 positions 8.6 GB). With TransformerLens's ``return_type``
        ("logits", "loss", "both", None) what TransformerLens returns (``probe.models.lens``)."""
        if return_type is not HF_OUTPUT:
            return self.lens_forward(
                input_ids, return_type, attention_mask=attention_mask, return_hidden=return_hidden, **kwargs
            )
        prepend_bos, padding_side = kwargs.pop("prepend_bos", None), kwargs.pop("padding_side", None)
        if input_ids is not None or kwargs.get("inputs_embeds") is None:  # token ids checked (probe.models.inputs)
            input_ids, _ = self.input_tokens(input_ids, prepend_bos, padding_side, cached_length(kwargs))
        kwargs.setdefault("use_cache", False)
        # read by the edits at position 0 (a value edit), which a pad there would take: refused on padded rows
        padded = isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2 and not attention_mask.all()
        self.padded_forward = bool(padded)
        try:
            if return_hidden:
                base = self.hf_model.base_model
                if base is self.hf_model:  # a causal LM whose base_model_prefix names no submodule (Llama 4 text)
                    base = self.hf_model.model
                return base(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
            return self.hf_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        finally:
            self.padded_forward = False

    def input_limits(self) -> tuple[int, int | None, str]:
        """(vocabulary size, maximum context or None, name) that token ids are checked against: the config's
        ``max_position_embeddings``, none where it declares none or scales its rotary dynamically
        (:func:`probe.models.inputs.hf_context_limit`: HF's own forward runs past it without a word)."""
        info = self.probe_info
        return info.vocab_size, hf_context_limit(self.hf_model.config), info.name

    @property
    def input_device(self) -> torch.device:
        """Where token ids go: the input embedding's device, or where accelerate runs it when it is offloaded."""
        embed = self.hf_model.get_input_embeddings()
        if embed.weight.device.type != "meta":
            return embed.weight.device
        hook = getattr(embed, "_hf_hook", None) or getattr(self.hf_model, "_hf_hook", None)
        device = getattr(hook, "execution_device", None)
        return torch.device(device) if device not in (None, "disk", "meta") else torch.device("cpu")

    def unembed(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of final-normed hidden states: the LM head and, where the config has one, the final-logit
        soft-cap (Gemma 2), as the HF forward computes them."""
        logits = self.hf_model.get_output_embeddings()(hidden)
        factor = logit_factor(self.hf_model)
        logits = logits if factor == 1.0 else logits * factor
        cap = getattr(self.hf_model.config, "final_logit_softcapping", None)
        return logits if not cap else torch.tanh(logits / cap) * cap

    def unembedding(self) -> Unembedding:
        """The LM head for the cache's logit attribution (probe.models.cache): its weight (V,d) and bias, and the
        final-logit soft-cap where the config has one (Gemma 2), as :meth:`unembed` applies them."""
        head = self.hf_model.get_output_embeddings()
        cap = getattr(self.hf_model.config, "final_logit_softcapping", None)
        return Unembedding(head.weight, getattr(head, "bias", None), cap or None)

    def norm_module(self, layer: int | None = None, which: str = "ln1") -> nn.Module | None:
        """The final norm (layer None) or decoder layer ``layer``'s norm ``which`` (ln1 / ln2: the attention's / MLP's
        input; ln1_post / ln2_post: the norms on their outputs), as :meth:`norm_names` names it; None where the layer
        has none or the family names none: what the ActivationCache applies to stacks (probe.models.cache)."""
        if layer is None:
            return final_norm_module(self.hf_model)
        attr = self.norm_names().get(which)
        return None if attr is None else getattr(self.decoder_layers(self.hf_model)[layer], attr, None)

    def norm_names(self) -> dict[str, str]:
        """Block norm -> the HF layer's attribute (``{"ln1": "input_layernorm", ...}``); the generic route: none."""
        return {}

    def rotary_tables(self, layer: int, T: int, device=None):
        """(cos, sin) (T, d_rot/2) fp32 (fp64 for fp64 frequencies) of layer ``layer``'s rotary at positions 0 .. T-1
        (rotate-half pairs over the first d_rot coordinates of hook_rot_q / hook_rot_k, as transformers rotates them),
        None without rotary: what re-rotates a query to another position (eviction at positions within the cache).
        The frequencies are the rotary module's ``inv_freq`` (``<layer type>_inv_freq`` where layer types have their
        own, Gemma 3), as the forward last set them (dynamic scalings update them in the forward); its attention
        scaling multiplies q and k alike and is no rotation."""
        base = getattr(self.hf_model.base_model, "language_model", self.hf_model.base_model)
        attn = self.attention_module(self.decoder_layers(self.hf_model)[layer])
        rope = getattr(attn, "rotary_emb", None) or getattr(base, "rotary_emb", None)
        if rope is None or not rotates_halves(attn):
            return None
        types = getattr(self.hf_model.config.get_text_config(), "layer_types", None)
        inv = getattr(rope, f"{types[layer]}_inv_freq", None) if types else None
        inv = getattr(rope, "inv_freq", None) if inv is None else inv
        if inv is None:
            return None
        dtype = torch.promote_types(inv.dtype, torch.float32)  # fp64 frequencies (an fp64 model) stay fp64
        angle = torch.arange(T, device=inv.device, dtype=dtype)[:, None] * inv.to(dtype)[None, :]
        return angle.cos().to(device or inv.device), angle.sin().to(device or inv.device)

    def generate(self, *args, **kwargs):
        return self.hf_model.generate(*args, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def config(self):
        return self.hf_model.config

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.probe_info.name!r}, family={self.family!r}, layers={len(self.blocks)})"


def cached_length(kwargs: dict) -> int:
    """Positions already in the KV cache a forward is given (``cache``, formerly ``past_key_values``), 0 without
    one."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    length = getattr(cache, "get_seq_length", None)
    return int(length()) if callable(length) else 0


FINAL_NORMS = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f")  # HF's names for the final norm


def final_norm_module(hf_model: nn.Module) -> nn.Module | None:
    """The norm the decoder applies after its last layer (the base model's, its decoder's or its language model's
    ``norm`` / ``ln_f`` / ...), None where none of those names is a module."""
    base = hf_model.base_model if hf_model.base_model is not hf_model else getattr(hf_model, "model", hf_model)
    for owner in (base, getattr(base, "language_model", None), getattr(base, "decoder", None)):
        for name in FINAL_NORMS:
            module = getattr(owner, name, None) if owner is not None else None
            if isinstance(module, nn.Module):
                return module
    return None


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def modeling_sources(hf_model: nn.Module) -> str:
    """The source of every modeling module the model's classes come from (what its code can read of its config)."""
    found = {type(m).__module__ for m in hf_model.modules()}
    return "\n".join(_source(module) for name in sorted(found) if (module := sys.modules.get(name)) is not None)


def drop_unread_keys(info: ModelInfo, hf_model: nn.Module, layers, attention_module) -> None:
    """A config key the family's code never reads changes nothing HF computes, so it must change nothing probe
    describes: a stray ``num_key_value_heads`` in a GPT-2 config (GPT-2's code has no grouped heads) and an
    ``attn_logit_softcapping`` that the attention modules never pass to the attention function (Gemma 3 stores it
    and does not use it) are ignored, as HF ignores them."""
    if "num_key_value_heads" not in modeling_sources(hf_model):
        info.n_kv_heads = info.n_heads
    if any(info.attention_at(layer).softcap for layer in info.attention_layers):
        attns = [a for a in (attention_module(layer) for layer in layers) if a is not None]
        if attns and not any("softcap=" in _source(type(a).forward) for a in attns):
            info.extra["attn_logit_softcap"] = None


# how a causal LM's forward scales the LM head's logits (the head has no bias, so scaling its input is the same):
# (the source it is written with, the config key, whether the logits are divided by it)
LOGIT_SCALINGS = (
    ("* self.logit_scale", "logit_scale", False),  # Cohere
    ("logits / self.config.logits_scaling", "logits_scaling", True),  # Granite
    ("hidden_states / self.config.logits_scaling", "logits_scaling", True),  # MiniCPM3 (before the head)
    ("* self.config.logits_scaling", "logits_scaling", False),  # HyperCLOVA X
)


def logit_factor(hf_model: nn.Module) -> float:
    """The factor the model's own forward multiplies the LM head's logits by (1.0 for most): ``unembed`` of the final
    hidden states must give the logits the HF forward gives, or every loss computed from them is off."""
    cached = hf_model.__dict__.get("_probe_logit_factor")
    if cached is None:
        source, cached = _source(type(hf_model).forward), 1.0
        for written, key, divides in LOGIT_SCALINGS:
            value = getattr(hf_model.config, key, None)
            if written in source and value:
                cached = 1.0 / float(value) if divides else float(value)
                break
        hf_model.__dict__["_probe_logit_factor"] = cached
    return cached


def fp64_experts(hf_model: nn.Module) -> None:
    """An fp64 mixture of experts runs its experts as a loop: transformers' default grouped matmul has no fp64 kernel
    ("Expected mat_a to be Float32 ... got Double"), so an fp64 checkpoint loaded from a folder failed on its first
    forward. Modules transformers keeps in fp32 whatever the dtype asked (a router's score bias) are made fp64 too, or
    the first forward stops on "expected m1 and m2 to have the same dtype". Other dtypes keep the default."""
    can_set = getattr(hf_model, "_can_set_experts_implementation", None)
    dtypes = {t.dtype for t in (*hf_model.parameters(), *hf_model.buffers()) if t.is_floating_point()}
    if torch.float64 not in dtypes:
        return
    if torch.float32 in dtypes:  # modules transformers keeps in fp32 (routers, score biases) would meet fp64 inputs
        hf_model.to(torch.float64)
    if can_set is not None and can_set():
        hf_model.set_experts_implementation("eager")


def layer_source_hash(layer: nn.Module) -> str:
    """A short hash of the source of ``type(layer).forward`` without comments, docstrings and whitespace: what the
    coverage table records for each type a replaced layer forward was shown equal to."""
    try:
        src = inspect.getsource(type(layer).forward)
    except (OSError, TypeError):
        return ""
    src = re.sub(r'"""[\s\S]*?"""', "", re.sub(r"#[^\n]*", "", src))
    return hashlib.sha256(" ".join(src.split()).encode()).hexdigest()[:12]


def _hook_once(module: nn.Module, key: str, target, hook) -> None:
    """Point ``module.__dict__[key]`` at ``target`` and register the forward ``hook`` unless it already is (an
    adapter built again on the same model re-points the entry; the hook reads it at call time)."""
    module.__dict__[key] = target
    if hook not in module._forward_hooks.values():
        module.register_forward_hook(hook)


def _default_name(hf_model) -> str:
    return getattr(hf_model.config, "_name_or_path", "") or type(hf_model).__name__


def layer_kind(name: str) -> str:
    """A config's layer-type name (``layer_types`` entries across transformers) as probe's layer type."""
    n = name.lower()
    if "sliding" in n or n in ("local", "local_attention", "swa"):
        return "sliding"
    if "chunk" in n:
        return "chunked"
    if any(w in n for w in ("linear", "mamba", "ssm", "conv", "recurrent", "rwkv", "delta", "lightning")):
        return "linear"
    if "attention" in n or n in ("full", "global", "attn", "transformer"):
        return "full"
    raise ValueError(f"unknown layer type {name!r} in the config's layer_types")


def _ffn_layer_types(config, n_layers: int) -> list[str]:
    types_ = getattr(config, "layer_types", None)
    if types_:
        return [layer_kind(t) for t in types_][:n_layers]
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return ["sliding"] * n_layers
    return ["full"] * n_layers


def base_info(config, name: str, family: str, **over) -> ModelInfo:
    """The ModelInfo fields every decoder-only HF config provides."""
    n_heads = config.num_attention_heads
    # latent attention (DeepSeek): queries and keys are qk_head_dim wide (head_dim names their rotary part); a
    # family whose head width varies by layer (Gemma 4) passes its own
    d_head = over.pop("d_head", None) or (
        getattr(config, "qk_head_dim", None) or getattr(config, "head_dim", None) or config.hidden_size // n_heads
    )
    n_layers = config.num_hidden_layers
    layer_types = _ffn_layer_types(config, n_layers)
    fields = dict(
        name=name,
        family=family,
        n_layers=n_layers,
        d_model=config.hidden_size,
        n_heads=n_heads,
        n_kv_heads=getattr(config, "num_key_value_heads", None) or n_heads,
        d_head=d_head,
        n_ctx=getattr(config, "max_position_embeddings", 2048),
        vocab_size=config.vocab_size,
        layer_types=layer_types,
        sliding_window=getattr(config, "sliding_window", None) if "sliding" in layer_types else None,
        bos_token_id=getattr(config, "bos_token_id", None),
        extra={"model_type": config.model_type, "dtype": str(getattr(config, "dtype", "") or "")},
    )
    if "chunked" in layer_types:  # queries see the causal keys of their own chunk of this many positions
        fields["extra"]["attn_chunk"] = int(config.attention_chunk_size)
    fields["extra"].update(over.pop("extra", {}))
    fields.update(over)
    return ModelInfo(**fields)


# --------------------------------------------------------------------------------------------------------------
# structural copies that share parameters (for wrap(): never mutate the user's model)

_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


def _unwrap(module: nn.Module) -> nn.Module:
    """A TransformerBridge component keeps the HF module it replaced as ``_original_component``."""
    while "_original_component" in module._modules:
        module = module._modules["_original_component"]
    return module


def _is_foreign_forward(fwd) -> bool:
    """An instance ``forward`` put there by nnsight (its Controller) or by us, not by accelerate/HF."""
    mod = getattr(type(fwd), "__module__", "") or ""
    if mod.startswith("nnsight"):
        return True
    return getattr(fwd, "__func__", None) in INSTANCE_FORWARDS


def shared_clone(model: nn.Module) -> nn.Module:
    """A copy of an HF model's module tree that shares every parameter and buffer with ``model``.

    TransformerBridge components are replaced by the HF modules they wrap, nnsight's instance forwards and all
    forward/backward hooks are dropped, and the config is copied, so adapting the clone leaves ``model`` (and any
    bridge or nnsight wrapper around it) untouched.
    """
    model = _unwrap(model)
    new_config = copy.deepcopy(model.config) if hasattr(model, "config") else None
    old_config = getattr(model, "config", None)
    memo: dict[int, nn.Module] = {}

    def clone(mod: nn.Module) -> nn.Module:
        mod = _unwrap(mod)
        if id(mod) in memo:
            return memo[id(mod)]
        new = copy.copy(mod)
        memo[id(mod)] = new
        d = new.__dict__
        d["_parameters"] = OrderedDict(mod._parameters)
        d["_buffers"] = OrderedDict(mod._buffers)
        d["_non_persistent_buffers_set"] = set(mod._non_persistent_buffers_set)
        for h in _HOOK_DICTS:
            if h in d:
                d[h] = OrderedDict()
        for key in [k for k, v in d.items() if k == "forward" and _is_foreign_forward(v)]:
            del d[key]
        for key in [k for k in d if k.startswith(("__nnsight", "_nnsight", "_probe_"))]:
            del d[key]
        if old_config is not None and d.get("config") is old_config:
            d["config"] = new_config
        d["_modules"] = OrderedDict(
            (name, None if child is None else clone(child))
            for name, child in mod._modules.items()
            if not isinstance(child, HookPoint)
        )
        return new

    return clone(model)


def is_hooked(obj) -> bool:
    return isinstance(obj, HookedRootModule) and hasattr(obj, "probe_info")
