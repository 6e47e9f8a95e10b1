"""One pre-norm transformer block; its residual stream is either the plain sum, a dense mix, depth reads, or n
hyper-connected streams."""

from __future__ import annotations

import torch
import torch.nn as nn
from transformer_lens.hook_points import HookPoint

from probe.models.attention import Attention
from probe.models.config import ProbeConfig
from probe.models.dense import make_mix
from probe.models.depth import DepthRead, DepthSources, emitted_key_width, make_read
from probe.models.hyper import make_hyper, through_sum
from probe.models.layers import MLP, make_norm


class Block(nn.Module):
    param_roles = {"ln1": "norm", "ln1_k": "norm", "ln1_v": "norm", "ln2": "norm"}

    def __init__(self, config: ProbeConfig, layer: int):
        super().__init__()
        c = config
        key_rank = emitted_key_width(c)  # P-LR: each sub-layer emits a routing key beside its output
        self.ln1 = make_norm(c.norm, c.d_model, c.norm_eps, c.norm_bias, points="own")  # ln1.hook_scale, ...
        if c.dense_stream_norms and layer > 0:  # MUDD's sepln: the key and value streams get norms of their own
            self.ln1_k = make_norm(c.norm, c.d_model, c.norm_eps, c.norm_bias)
            self.ln1_v = make_norm(c.norm, c.d_model, c.norm_eps, c.norm_bias)
        self.attn = Attention(c, layer, key_rank)
        self.ln2 = make_norm(c.norm, c.d_model, c.norm_eps, c.norm_bias, points="own")
        self.mlp = MLP(c.d_model, c.layer_d_mlp(layer), c.mlp, key_rank, c.mlp_bias)
        self.parallel_residual = c.parallel_residual
        if c.depth != "residual":
            if layer > 0:  # site 1 (before block 0's attention) reads only the embedding: no query
                self.attn_read = make_read(c)
            self.mlp_read = make_read(c)
        if c.dense != "none":
            self.dense = make_mix(c, layer)
        if c.hyper != "none":  # sub-layer k = 2l (attention), 2l + 1 (MLP): static HC's first read is stream k mod n
            self.hc_attn, self.hc_mlp = make_hyper(c, 2 * layer), make_hyper(c, 2 * layer + 1)
            self.hook_streams = HookPoint()  # B,T,n,d the streams the block reads
            self.hook_streams_mid = HookPoint()  # B,T,n,d the streams after the attention's connection
            self.materialize = False  # fire hook_resid_pre / mid / post (the streams' sums) though no hook asks
        self.hook_resid_pre = HookPoint()  # B,T,d
        self.hook_attn_out = HookPoint()  # B,T,d what the attention adds to the stream (a depth source when routed)
        self.hook_resid_mid = HookPoint()  # B,T,d
        self.hook_mlp_out = HookPoint()  # B,T,d what the MLP adds (a depth source when routed)
        self.hook_resid_post = HookPoint()  # B,T,d

    def forward(self, x: torch.Tensor, v_first=None, qkv: list[torch.Tensor] | None = None):
        """Plain or dense residual. x: B,T,d residual input; qkv: MUDD's separate query/key/value inputs."""
        x = self.hook_resid_pre(x)
        if qkv is None:
            h = self.ln1(x)
            a, _, v_first = self.attn(h, v_first=v_first)
        else:
            # ln1's points are the query stream's norm: the key and value streams pass it unhooked
            unhooked = (self.ln1_k, self.ln1_v) if hasattr(self, "ln1_k") else (self.ln1.unhooked,) * 2
            norms = (self.ln1, *unhooked)
            a, _, v_first = self.attn(*(norm(s) for norm, s in zip(norms, qkv)), v_first=v_first)
        mid = self.hook_resid_mid(x + self.hook_attn_out(a))
        m, _ = self.mlp(self.ln2(x if self.parallel_residual else mid))  # parallel: the MLP reads the block input
        return self.hook_resid_post(mid + self.hook_mlp_out(m)), v_first

    def forward_routed(self, x: torch.Tensor, sources: DepthSources, next_read: DepthRead, v_first=None):
        """Depth-routed: x is this block's routed read; sub-layer outputs are appended to `sources`.
        Returns the next site's read (this block's resid_post)."""
        x = self.hook_resid_pre(x)
        a, key, v_first = self.attn(self.ln1(x), v_first=v_first)
        sources.add(self.hook_attn_out(a), key)
        x = self.hook_resid_mid(self.mlp_read(sources))
        m, key = self.mlp(self.ln2(x))
        sources.add(self.hook_mlp_out(m), key)
        return self.hook_resid_post(next_read(sources)), v_first

    def forward_hyper(self, streams: torch.Tensor, v_first=None):
        """Hyper-connected: streams (B,T,n,d) in and out. Each sub-layer reads its H_pre mix of the streams
        (hc_attn / hc_mlp .hook_read) and writes H_res X + H_post ⊗ its output; hook_resid_pre / mid / post are the
        streams' sums (an edit is spread equally over the streams), computed when a hook asks or probe.materialize
        is on."""
        lazy = not self.materialize
        streams = through_sum(self.hook_resid_pre, self.hook_streams(streams), lazy)
        x, mix = self.hc_attn.read(streams)
        a, v_first = self.attn_sublayer(x, v_first)
        streams = self.hook_streams_mid(self.hc_attn.write(streams, a, mix))
        streams = through_sum(self.hook_resid_mid, streams, lazy)
        x, mix = self.hc_mlp.read(streams)
        streams = self.hc_mlp.write(streams, self.mlp_sublayer(x), mix)
        return through_sum(self.hook_resid_post, streams, lazy), v_first

    def attn_sublayer(self, x: torch.Tensor, v_first=None):
        """A hyper-connected block's attention on its read x (B,T,d): (hook_attn_out's output, v_first)."""
        a, _, v_first = self.attn(self.ln1(x), v_first=v_first)
        return self.hook_attn_out(a), v_first

    def mlp_sublayer(self, x: torch.Tensor) -> torch.Tensor:
        """A hyper-connected block's MLP on its read x (B,T,d): hook_mlp_out's output."""
        m, _ = self.mlp(self.ln2(x))
        return self.hook_mlp_out(m)
