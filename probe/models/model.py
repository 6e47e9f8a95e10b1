"""ProbeForCausalLM: an HF PreTrainedModel and a TransformerLens HookedRootModule in one.

Every tensor of docs/definitions.md#hook-namespace that the configured mechanisms produce passes through a HookPoint of
that name, so `run_with_cache`/`run_with_hooks` work and return what TransformerLens's do (lens.py: the logits tensor,
or what ``return_type`` asks for), `save_pretrained`/`AutoModelForCausalLM` as in HF. Parameters are initialised by
the role their module declares (params.py); checkpoints saved under older parameter names (LEGACY_NAMES) are renamed
where saved weights are read: `from_pretrained` and the trainer's resume.
"""

from __future__ import annotations

import math
import os
import re
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from probe.hooks import names
from probe.hooks.info import ModelInfo
from probe.kernels.backend import check_backend, use_backend
from probe.kernels.diff_attention import SIGNED_RULES
from probe.kernels.row_rules import ROW_RULES
from probe.models.block import Block
from probe.models.cache import Unembedding
from probe.models.config import ProbeConfig
from probe.models.depth import DepthSources, block_factor, emitted_key_width, make_read, site_sources
from probe.models.gates import GATES
from probe.models.hyper import HYPERS, expand
from probe.models.hyper_boundary import boundary, fusable
from probe.models.layers import NormPoints, UnembedPoints, make_norm
from probe.models.lens import HF_OUTPUT, TransformerLensCalls, refuse_lens_options
from probe.models.params import ROLES, no_decay_names, parameter_roles
from probe.progress import quiet_hf_bars
from probe.runs import SAVED_RECORD_KEY

# parameter names of checkpoints saved before the value gates became modules -> today's, relative to an attention
# module; only the readers of saved weights rename them (from_pretrained here, probe.train.checkpoint.load_model)
LEGACY_NAMES = {
    "gate_tau": "gate.tau",
    "gate_w": "gate.w",
    "gate_b": "gate.b",
    "g2_proj.weight": "gate.proj.weight",
    "v_gate_proj.weight": "gate.proj.weight",
}
_LEGACY_KEYS = {rf"^(blocks\.\d+\.attn\.){re.escape(old)}$": rf"\1{new}" for old, new in LEGACY_NAMES.items()}


def current_names(state: dict) -> dict:
    """A saved state dict with its LEGACY_NAMES keys under today's names (a key whose new name is present stays)."""
    out = dict(state)
    for key in state:
        for old, new in _LEGACY_KEYS.items():
            renamed = re.sub(old, new, key)
            if renamed != key and renamed not in state:
                out[renamed] = out.pop(key)
    return out


def _param_seed(seed: int, name: str) -> int:
    """A generator seed per (seed, parameter name): paired variants share every tensor they share."""
    return zlib.crc32(f"{seed}:{name}".encode())


class ProbeForCausalLM(TransformerLensCalls, PreTrainedModel, HookedRootModule):
    config_class = ProbeConfig
    base_model_prefix = "probe"
    _no_split_modules = ["Block"]
    main_input_name = "input_ids"
    param_roles = {
        "embed": "embedding",
        "pos_embed": "position",
        "sink_token": "sink_token",
        "embed_key": "routing_key",
        "ln_f": "norm",
        "lm_head": "embedding",
        "depth_block_mean": "mixing",
        "depth_block_prior": "mixing",
    }

    def __init__(self, config: ProbeConfig, seed: int = 0, backend: str | None = None):
        """``backend``: this model's attention backend (probe.kernels.backend), a run-time setting that is never
        saved; None follows ``probe.kernels.use_backend`` / $PROBE_BACKEND."""
        super().__init__(config)
        c = config
        self.backend = None if backend is None else check_backend(backend)
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        if c.pos == "learned":  # a sink token takes one extra position
            self.pos_embed = nn.Embedding(c.n_ctx + (c.abstention == "sinktoken"), c.d_model)
        if c.abstention == "sinktoken":
            self.sink_token = nn.Parameter(torch.zeros(c.d_model))
        if emitted_key_width(c):  # W_0^K: the embedding's low-rank key (P-LR; LR-AttnRes 2026 Eq. 13)
            self.embed_key = nn.Linear(c.d_model, emitted_key_width(c), bias=False)
        if c.depth_block_mean_learned:  # the LR-AttnRes authors' learned block-mean power (one scalar)
            self.depth_block_mean = nn.Parameter(torch.tensor(c.depth_block_mean))
        if c.depth_block_prior_learned:  # their learned log-count prior weight (one scalar)
            self.depth_block_prior = nn.Parameter(torch.tensor(c.depth_block_prior))
        self.blocks = nn.ModuleList(Block(c, l) for l in range(c.n_layers))
        if c.depth != "residual":
            self.final_read = make_read(c)
        if c.hyper != "none":  # what collapses the n streams before the final norm (the sum, or mHC's own head)
            self.hc_head = HYPERS[c.hyper].head(c)
        self.ln_f = make_norm(c.norm, c.d_model, c.norm_eps, c.norm_bias, points="given")
        self.ln_final = NormPoints()  # ln_f's hook_scale / hook_normalized, under TransformerLens's name
        if not c.tie_embeddings:
            self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.hook_embed = HookPoint()  # B,T,d
        if c.pos == "learned":
            self.hook_pos_embed = HookPoint()  # B,T,d
        # unembed.hook_in (B,T,d, what the LM head reads): the container is named as TransformerLens's unembed
        # module, while self.unembed stays the method; add_module refuses a name the class already uses
        self._modules["unembed"] = UnembedPoints()
        # what whoever makes the model (probe.load, create, a recipe) knows of it, read by probe_info:
        self.tokenizer = None  # its tokenizer, where the loader knows it
        self.probe_name: str | None = None  # the identity every analysis output records (None: the config's path)
        self.train_record: dict | None = None  # what its training run recorded (probe.runs.training_record)
        self.setup()  # TransformerLens: name every HookPoint
        self.post_init()
        self.init_weights_from_seed(seed)

    # ---- initialisation ---------------------------------------------------------------------------------
    def _init_weights(self, module):  # HF hook: our initialisation is init_weights_from_seed
        pass

    @torch.no_grad()
    def init_weights_from_seed(self, seed: int) -> None:
        """Draw every random parameter from a generator keyed by (seed, name), as its declared role says;
        constants (sinks, gate τ/w/b, queries, mixing weights, norms) keep the value their module gave them."""
        c = self.config
        depth_scale = 1 / math.sqrt(2 * c.n_layers)
        roles = parameter_roles(self)
        for name, p in self.named_parameters():
            init = ROLES[roles[name]].init
            if p.is_meta or init == "constant":
                continue
            g = torch.Generator().manual_seed(_param_seed(seed, name))
            std = 0.02 if c.init == "gpt2" else 1 / math.sqrt(p.shape[-1])  # GPT-2's constant, or fan-in
            if init == "lambda":  # the authors' N(0, 0.1²), under either init scheme
                std = 0.1
            if init == "output":
                std *= depth_scale
            p.copy_(torch.randn(p.shape, generator=g) * std)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """HF's from_pretrained, reading checkpoints saved under the old gate parameter names too."""
        kwargs["key_mapping"] = {**_LEGACY_KEYS, **(kwargs.get("key_mapping") or {})}
        model = super().from_pretrained(*args, **kwargs)
        model._weight_conversions = None  # HF would write the legacy names back on save; today's names it is
        return model

    def save_pretrained(self, save_directory, *args, **kwargs):
        """HF's save_pretrained without its "Writing model shards" bar, recording the model's name (``probe_name``,
        e.g. ``tiny-sink+proj``) in config.json, so that ``probe.load`` of the folder names the model, not the
        folder, and what its training run recorded (its data, its BOS), so that the folder's default --data is the
        model's own. A name that is a folder's path (a training run's identity) is not recorded: the folder saved to
        is another model's home, and names itself."""
        if self.probe_name and not os.path.isabs(self.probe_name):
            self.config.probe_name = self.probe_name
        if self.train_record:  # its training data and BOS travel with it (probe.runs.saved_training_record)
            setattr(self.config, SAVED_RECORD_KEY, self.train_record)
        with quiet_hf_bars():
            return super().save_pretrained(save_directory, *args, **kwargs)

    # ---- forward ----------------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        return_hidden: bool = False,
        return_type=HF_OUTPUT,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        **kwargs,
    ):
        """Logits (``CausalLMOutputWithPast``), or with ``return_hidden`` the final-normed hidden states B,T,d that
        :meth:`unembed` turns into logits (analyses unembed a few positions at a time to bound memory). With
        TransformerLens's ``return_type`` ("logits", "loss", "both", None) what TransformerLens returns (lens.py).
        ``input_ids`` may be a string or a list of strings (:meth:`to_tokens`, the BOS rule); token ids are checked
        first (probe.models.inputs: dtype, shape, T within ``n_ctx``, ids within the vocabulary), one line each."""
        if return_type is not HF_OUTPUT:
            if labels is not None:
                raise TypeError("labels= is the HF forward's; with return_type='loss' the targets are the input")
            return self.lens_forward(
                input_ids,
                return_type,
                prepend_bos=prepend_bos,
                padding_side=padding_side,
                attention_mask=attention_mask,
                return_hidden=return_hidden,
                **kwargs,
            )
        _refuse_unknown(kwargs)
        input_ids, _ = self.input_tokens(input_ids, prepend_bos, padding_side)
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("probe models take unpadded windows; attention_mask with zeros is not supported")
        with use_backend(self.backend):  # None: the caller's use_backend / $PROBE_BACKEND
            return self._forward(input_ids, labels, return_hidden)

    def input_limits(self) -> tuple[int, int | None, str]:
        """(vocabulary size, maximum context, name) that token ids are checked against (probe.models.inputs): the
        config's, without building the ModelInfo on every forward."""
        c = self.config
        return c.vocab_size, c.n_ctx, self.probe_name or c.name_or_path or "probe"

    def unembed(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of final-normed hidden states (..., d): the LM head alone (its input through
        unembed.hook_in)."""
        hidden = self._modules["unembed"].hook_in(hidden)
        return F.linear(hidden, self.embed.weight) if self.config.tie_embeddings else self.lm_head(hidden)

    def unembedding(self) -> Unembedding:
        """The LM head (the embedding when tied; no bias, no soft-cap), for the cache's logit attribution."""
        return Unembedding(self.embed.weight if self.config.tie_embeddings else self.lm_head.weight)

    def norm_module(self, layer: int | None = None, which: str = "ln1") -> nn.Module | None:
        """The final norm (layer None) or block ``layer``'s norm ``which`` (ln1: the attention's input, ln2: the
        MLP's): what the ActivationCache applies to stacks (probe.models.cache)."""
        if layer is None:
            return self.ln_f
        return getattr(self.blocks[layer], which, None) if which in ("ln1", "ln2") else None

    def depth_block_factor(self, count: int) -> float | torch.Tensor:
        """What a block depth source of ``count`` sub-layer outputs is multiplied by (the block mean, count**-p)."""
        c = self.config
        return block_factor(count, self.depth_block_mean if c.depth_block_mean_learned else c.depth_block_mean)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The stream the blocks start from (B,T,d; T+1 with a sink token): hook_embed, the token embedding (with
        the sink token prepended), plus hook_pos_embed where positions are learned."""
        c = self.config
        B, T = input_ids.shape
        x = self.embed(input_ids)  # B,T,d
        if c.abstention == "sinktoken":  # learned first token; its output is removed before the LM head
            x = torch.cat([self.sink_token.to(x.dtype).expand(B, 1, -1), x], dim=1)
        if c.strict_ctx and T > c.n_ctx:  # an authors' model: their code cannot run past its block_size
            raise ValueError(f"sequence length {T} exceeds the model's context n_ctx={c.n_ctx} (strict_ctx)")
        x = self.hook_embed(x)
        if c.pos != "learned":
            return x
        if x.shape[1] > self.pos_embed.num_embeddings:
            raise ValueError(f"sequence length {T} exceeds the model's context n_ctx={c.n_ctx}")
        positions = self.pos_embed.weight[: x.shape[1]].expand_as(x)  # B,T,d (a view)
        if self.hook_pos_embed.has_hooks():  # a hook may write into it: its own copy
            positions = positions.clone()
        return x + self.hook_pos_embed(positions)

    def _first_input(self, x: torch.Tensor) -> torch.Tensor:
        """Block 0's input where the embedding is also a depth source (routed or dense mixing): a copy when a hook on
        its hook_resid_pre may write into it, so that the edit stays block 0's input, as a returned copy would, and
        does not reach the embedding the later reads and mixes take."""
        return x.clone() if self.blocks[0].hook_resid_pre.has_hooks() else x

    def _forward_hyper_fused(self, streams: torch.Tensor, v_first=None) -> torch.Tensor:
        """The hyper-connected blocks with each write fused with the next read (probe.models.hyper_boundary; the
        same sums as forward_hyper's, where no hook is attached): streams (B,T,n,d) -> the head's collapse (B,T,d)."""
        x, mix = self.blocks[0].hc_attn.read(streams)
        readers = [blk.hc_attn for blk in self.blocks[1:]] + [self.hc_head]  # who reads each block's output
        for blk, next_reader in zip(self.blocks, readers, strict=True):
            a, v_first = blk.attn_sublayer(x, v_first)
            streams, x, mix = boundary(streams, a, mix, blk.hc_mlp)
            streams, x, mix = boundary(streams, blk.mlp_sublayer(x), mix, next_reader)
        return x

    def _forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None, return_hidden: bool = False):
        c = self.config
        x = self._embed(input_ids)  # B,T,d

        v_first = None
        if c.depth != "residual":
            mean_power = self.depth_block_mean if c.depth_block_mean_learned else c.depth_block_mean
            prior = self.depth_block_prior if c.depth_block_prior_learned else c.depth_block_prior
            embed_key = self.embed_key(x) if hasattr(self, "embed_key") else None
            sources = DepthSources(c, x, embed_key, mean_power, prior)
            x = self._first_input(x)
            for l, blk in enumerate(self.blocks):
                next_read = self.blocks[l + 1].attn_read if l + 1 < c.n_layers else self.final_read
                x, v_first = blk.forward_routed(x, sources, next_read, v_first)
        elif c.dense != "none":
            hiddens, streams = [x], [self._first_input(x)]
            for blk in self.blocks:
                qkv = streams[:3] if len(streams) == 4 else None
                h, v_first = blk(streams[-1], v_first, qkv=qkv)
                hiddens.append(h)
                streams = blk.dense(hiddens)  # MUDD: (q, k, v, residual) for the next block; else one stream
            x = streams[-1]
        elif c.hyper != "none":
            streams = expand(x, c.hc_streams)  # B,T,n,d
            if fusable(self):  # no hook can see the difference: each write fused with the next read
                x = self._forward_hyper_fused(streams, v_first)
            else:
                for blk in self.blocks:
                    streams, v_first = blk.forward_hyper(streams, v_first)
                x = self.hc_head(streams)
        else:
            for blk in self.blocks:
                x, v_first = blk(x, v_first)

        x = self.ln_f(x, self.ln_final)
        if c.abstention == "sinktoken":
            x = x[:, 1:]
        if return_hidden:
            return x  # B,T,d
        logits = self.unembed(x)  # B,T,V
        loss = None
        if labels is not None:
            # shift the labels, not the logits: slicing B,T,V logits costs a copy forward and a zero-fill backward
            targets = F.pad(labels[:, 1:], (0, 1), value=-100)  # B,T; the last position has no next token
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    # ---- HF glue ----------------------------------------------------------------------------------------
    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return None if self.config.tie_embeddings else self.lm_head

    # ---- what analyses and trainers may ask ------------------------------------------------------------
    def rotary_tables(self, layer: int, T: int, device=None):
        """(cos, sin) (T, d_rot/2) fp32 of layer ``layer``'s rotary at positions 0 .. T-1 (rotate-half pairs over the
        first d_rot coordinates of hook_rot_q / hook_rot_k), None without rotary: what re-rotates a query to another
        position (eviction at positions within the cache)."""
        rotary = self.blocks[layer].attn.rotary
        if rotary is None:
            return None
        cos, sin = rotary.tables(T, device or self.embed.weight.device, torch.float32)  # (T, 1, d_rot), halves equal
        half = rotary.d_head // 2
        return cos[:, 0, :half], sin[:, 0, :half]

    def unfired_points(self) -> frozenset[str]:
        """Hook points this model has but never fires (a block's attention has every point; a variant's mechanisms
        fire theirs: no gate, no hook_v_gate): found once, by a forward over two tokens with every point hooked,
        which leaves the random state as it was."""
        found = self.__dict__.get("_unfired_points")
        if found is None:
            asked = [
                n
                for n in self.hook_dict
                if names.attn_point(n) not in _MATERIALISED and self.probe_info.lacks(n) is None
            ]
            fired = _fired_points(self, asked)
            found = frozenset(n for n in asked if n not in fired)
            self.__dict__["_unfired_points"] = found
        return found

    def no_weight_decay(self) -> set[str]:
        """Parameter names excluded from weight decay by their declared role (sink logits, gates, routing queries,
        mixing weights, norms), not by tensor rank (docs/definitions.md#weight-decay)."""
        return no_decay_names(self)

    @property
    def probe_info(self) -> ModelInfo:
        c = self.config
        replaced = [m for m in (c.depth, c.dense, c.hyper) if m not in ("residual", "none")]
        depth = replaced[0] if replaced else "residual"  # what replaces the residual stream (at most one does)
        routed = c.depth != "residual"  # DepthRead sites over sub-layer sources (dense connections have none)
        extra: dict[str, object] = {"depth_sites": site_sources(c)} if routed else {}
        if c.hyper != "none":  # n streams; hook_resid_pre / mid / post their sums (the hook algebra's stream rules)
            extra.update(hc_streams=c.hc_streams)
        if getattr(c, "authors_format", None):  # an authors' checkpoint: its format, code version, RoPE table
            extra["authors_format"] = c.authors_format
        gate = GATES.get(c.value_gate)  # the registered gate class, None without a gate
        return ModelInfo(
            name=self.probe_name or c.name_or_path or "probe",
            family="probe",
            n_layers=c.n_layers,
            d_model=c.d_model,
            n_heads=c.n_heads,
            n_kv_heads=c.n_kv_heads,
            d_head=c.d_head,
            n_ctx=c.n_ctx,
            vocab_size=c.vocab_size,
            has_phantom=c.has_phantom,
            value_gate=c.value_gate,
            has_value_gate=gate is not None,
            gate_on_logits=gate is not None and gate.routing,  # declared by the gate
            forget_gate=c.forget_gate,
            out_gate=c.out_gate,
            has_out_gate=c.out_gate != "none",
            has_depth_sources=routed,
            depth_routing=depth,
            depth_blocks=c.depth_blocks,
            sink_token=c.abstention == "sinktoken",
            trained_with_bos=bool((self.train_record or {}).get("bos")),
            attention_rule=c.attn_fn,
            absent_hooks=_absent_under_rule(c.attn_fn),
            extra=extra,
        )


# points whose hook makes the attention materialise what it computes fused (the T x T rows, each head's write): the
# probe below leaves them to probe_info.lacks, which knows when a rule never fires them
_MATERIALISED = ("pattern", "pattern_1", "pattern_2", "pattern_norm", "attn_scores", "phantom", "lse", "result")


# keywords HF's callers (its Trainer, pipelines) pass to a causal LM's forward, which a full forward without a KV cache
# does not need; any other keyword (a TransformerLens option without return_type, a typo) is refused, never dropped
HF_FORWARD_KEYWORDS = (
    "use_cache",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "past_key_values",
    "cache_position",
    "num_items_in_batch",
    "logits_to_keep",
)


def _refuse_unknown(kwargs: dict) -> None:
    refuse_lens_options(kwargs)
    unknown = [k for k in kwargs if k not in HF_FORWARD_KEYWORDS]
    if unknown:
        raise TypeError(f"forward() got an unexpected keyword argument {unknown[0]!r}")


def _fired_points(model, asked: list[str]) -> set[str]:
    """Which of the ``asked`` hook points a forward over two tokens fires, with the hooks already on them set aside
    for it (a caller's caching hook never sees this forward) and the random state left as it was."""
    fired: set[str] = set()
    points = [model.hook_dict[n] for n in asked]
    kept = [(point._forward_hooks, point.fwd_hooks, point.bwd_hooks) for point in points]
    device = model.embed.weight.device
    try:
        for point in points:  # a point's own lists, emptied: lazy points fire when they hold a hook
            point._forward_hooks, point.fwd_hooks, point.bwd_hooks = type(point._forward_hooks)(), [], []
            point.add_hook(lambda t, hook: fired.add(hook.name))
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            model(torch.zeros(1, 2, dtype=torch.long, device=device))
    finally:
        for point, (torch_hooks, fwd, bwd) in zip(points, kept):
            point._forward_hooks, point.fwd_hooks, point.bwd_hooks = torch_hooks, fwd, bwd
    return fired


def _absent_under_rule(attn_fn: str) -> list[str]:
    """The attention points a row rule other than softmax never fires, as absent_hooks spells a point below a block
    ("attn.hook_lse"): the lse (no rule of probe.kernels.row_rules has a log-normaliser), and the phantom where rows
    may sum past one (docs/definitions.md#pointwise-attention-rules)."""
    rule = ROW_RULES.get(attn_fn)
    if attn_fn in SIGNED_RULES:  # differential attention: signed rows, no phantom, no lse, a norm after the rows
        points = ["lse", "phantom", "pattern_norm"]
    elif rule is None:
        return []
    else:
        points = ["lse"] if rule.at_most_one else ["lse", "phantom"]
    return [names.attn(0, p).split(".", 2)[-1] for p in points]
