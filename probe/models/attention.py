"""One attention module for every inside-a-head mechanism (docs/definitions.md#phantom-key,
docs/definitions.md#value-gates; Wang 2026 §3, GatedV).

Routing side: baseline softmax or a phantom key (off-by-one: logit 0; sink logit: learned b_h). Value side: the value
residual, then the value gate (probe.models.gates: norm, projection, routing-slot, GatedV SiLU/tanh, G2, GLU), which
gives the aggregated values v_out and, for a routing-slot gate, a per-key logit bias log g_j. Both are computed here,
in PyTorch, on one path whether or not hooks are attached; then one attention op (probe.kernels.sink_attention) takes
(q, k, v_out, sink, key_bias). With no hook on the pattern the op's fused path runs (SDPA / CPU flash / Triton) and
nothing T×T is stored. Output side: an output gate (probe.models.out_gates, Qiu et al.'s G1) scales the op's output
per head, or per coordinate, by σ(x W_g) before the output projection (docs/definitions.md#output-gates).
A forget gate (FoX, probe.models.forget_gate, docs/definitions.md#forget-gate) adds its -Σ_{l≤j} log f_l to key j's
logits through the same key_bias.
Under another ``attn_fn`` (a rule of probe.kernels.row_rules: softpick, Zuhri et al. 2025, docs/definitions.md#softpick;
sigmoid, sigmoid-norm, elu1, elu1-norm, docs/definitions.md#pointwise-attention-rules) the rows are that rule's
instead of softmax's: its op takes (q, k, v_out); hook_pattern is the weight each key gets, hook_phantom the mass the
row leaves unspent (1 - Σ_j pattern) where rows sum to at most one; hook_lse does not fire (no log-normaliser).
Under ``attn_fn="diff"`` (differential attention, Ye et al. 2024, docs/definitions.md#differential-attention) each head
has two branch queries and keys (hook_q / hook_k hold 2H / 2Hkv heads, branch-major) and its row is the signed
difference p1 - λ p2 (hook_pattern_1, hook_pattern_2, hook_lambda, hook_pattern); its output takes the per-head
sub-layer norm and the (1 - λ_init) scale (probe.models.differential) before any output gate and hook_z.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformer_lens.hook_points import HookPoint

from probe.hooks.fire import fire
from probe.kernels import sink_attention
from probe.kernels.diff_attention import diff_attention, net_pattern, patterns_of_scores
from probe.kernels.row_rules import ROW_RULES
from probe.kernels.sink_attention import edits
from probe.kernels.sink_attention.reference import (
    apply_pattern,
    attention_scores,
    pattern_norms,
    probs_of_scores,
    scores_of_probs,
)
from probe.models.config import ProbeConfig
from probe.models.differential import Differential
from probe.models.forget_gate import ForgetGate
from probe.models.gates import apply_gate, make_gate
from probe.models.layers import RMSNorm, Rotary, project_with_key
from probe.models.out_gates import apply_out_gate, make_out_gate


class Attention(nn.Module):
    param_roles = {
        "q_proj": "matrix",
        "k_proj": "matrix",
        "v_proj": "matrix",
        "o_proj": "output",
        "key_proj": "routing_key",
        "sink": "sink",
        "v_mix": "mixing",
    }

    def __init__(self, config: ProbeConfig, layer: int, key_rank: int = 0):
        super().__init__()
        c = config
        self.layer, self.n_heads, self.n_kv = layer, c.n_heads, c.n_kv_heads
        self.d_head, self.d_value = c.d_head, c.d_value
        self.abstention, self.qk_activation = c.abstention, c.qk_activation
        self.rule = ROW_RULES.get(getattr(c, "attn_fn", "softmax"))  # None: softmax rows (sink attention's)
        self.rule_bias = self.rule.bias(c.n_ctx) if self.rule is not None else 0.0  # sigmoid's b = -log n_ctx
        self.diff = Differential(c.d_head, c.d_value, layer) if c.attn_fn == "diff" else None  # DIFF's λ and norm
        branches = 1 if self.diff is None else 2  # DIFF: two queries and keys per head (its two softmax branches)
        self.q_heads, self.k_heads = branches * c.n_heads, branches * c.n_kv_heads  # the heads q and k hold
        bias = c.linear_bias  # MUDDPythia (GPT-NeoX style); probe's own models are bias-free
        self.q_proj = nn.Linear(c.d_model, self.q_heads * c.d_head, bias=bias)
        self.k_proj = nn.Linear(c.d_model, self.k_heads * c.d_head, bias=bias)
        self.v_proj = nn.Linear(c.d_model, c.n_kv_heads * c.d_value, bias=bias)
        self.o_proj = nn.Linear(c.n_heads * c.d_value, c.d_model, bias=bias)
        self.key_proj = nn.Linear(c.n_heads * c.d_value, key_rank, bias=False) if key_rank else None  # P-LR key rows
        self.q_norm = RMSNorm(c.d_head, c.norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.d_head, c.norm_eps) if c.qk_norm else None
        self.rotary = Rotary(c.d_head, c.rope_theta, c.rotary_dims, c.rope_table, c.n_ctx) if c.pos == "rope" else None

        if c.abstention == "sinklogit":
            self.sink = nn.Parameter(torch.zeros(c.n_heads))  # b_h, init 0 (= off-by-one at init)
        self.gate = make_gate(c)  # None for ungated heads
        self.out_gate = make_out_gate(c)  # G1 on the attention op's output; None without one
        self.forget = ForgetGate(c.d_model, c.n_kv_heads) if c.forget_gate else None  # FoX: Σ log f on the logits
        self.value_residual = c.value_residual if layer > 0 else "none"  # layer 0's values are V_1
        if self.value_residual == "lambda":
            self.v_mix = nn.Parameter(torch.full((1,), 0.5))  # λ_n
        elif self.value_residual == "two-weight":
            self.v_mix = nn.Parameter(torch.full((2,), 0.5))  # (λ_{n,1} on V_1, λ_{n,2} on V_n)

        self.materialize = False  # fire the lazy hooks (pattern, phantom, lse, scores, result) on every forward
        self.hook_q = HookPoint()  # B,T,H,dh the projection's output (GatedV's SiLU included), before QK-norm and RoPE
        self.hook_k = HookPoint()  # B,T,Hkv,dh
        if self.q_norm is not None:  # only where there is a QK-norm (docs/definitions.md#hook-namespace)
            self.hook_q_normed = HookPoint()  # B,T,H,dh after QK-norm, before rotary
            self.hook_k_normed = HookPoint()  # B,T,Hkv,dh
        self.hook_rot_q = HookPoint()  # B,T,H,dh the query the scores are taken with (after QK-norm and rotary)
        self.hook_rot_k = HookPoint()  # B,T,Hkv,dh
        self.hook_v = HookPoint()  # B,T,Hkv,dv
        self.hook_v_first = HookPoint()  # B,T,Hkv,dv
        self.hook_v_mix = HookPoint()  # (1,) or (2,)
        self.hook_v_gate = HookPoint()  # B,T,Hkv or B,T,Hkv,dv
        self.hook_v_out = HookPoint()  # B,T,Hkv,dv
        self.hook_sink_logit = HookPoint()  # H
        self.hook_attn_scores = HookPoint()  # B,H,Tq,Tk pre-softmax, hidden keys -inf (fired only when hooked)
        self.hook_pattern = HookPoint()  # B,H,Tq,Tk
        self.hook_pattern_norm = HookPoint()  # B,H,Tq,Tk ||a_ij v_j W_O[h]|| (fired only when hooked; read-only)
        self.hook_phantom = HookPoint()  # B,H,Tq
        self.hook_lse = HookPoint()  # B,H,Tq real-key log-normaliser (fired only when hooked)
        if self.forget is not None:  # only where there is a forget gate (docs/definitions.md#hook-namespace)
            self.hook_forget_gate = HookPoint()  # B,T,Hkv fp32 f_t = σ(w_h·x_t + b_h), one per KV head
        if self.diff is not None:  # only under differential attention (docs/definitions.md#hook-namespace)
            self.hook_pattern_1 = HookPoint()  # B,H,Tq,Tk branch 1's softmax rows (lazy)
            self.hook_pattern_2 = HookPoint()  # B,H,Tq,Tk branch 2's softmax rows (lazy)
            self.hook_lambda = HookPoint()  # H λ per head; hook_pattern is p1 - λ p2
        self.hook_out_gate = HookPoint()  # B,T,H,dv or B,T,H
        self.hook_z = HookPoint()  # B,T,H,dv
        self.hook_result = HookPoint()  # B,T,H,d each head's write through o_proj (fired only when hooked)

    def forward(
        self,
        xq: torch.Tensor,
        xk: torch.Tensor | None = None,
        xv: torch.Tensor | None = None,
        v_first: torch.Tensor | None = None,
    ):
        """xq/xk/xv: B,T,d normalised inputs (MUDD feeds separate streams; otherwise all equal).
        Returns (output B,T,d, P-LR key B,T,r or None, V_1 for the value residual)."""
        xk = xq if xk is None else xk
        xv = xq if xv is None else xv
        B, T, _ = xq.shape
        q, k = self._query_key(xq, xk)
        v = self.hook_v(self.v_proj(xv).view(B, T, self.n_kv, self.d_value))

        if self.value_residual == "none":
            v_first = v if self.layer == 0 else v_first
        else:
            v_first = self.hook_v_first(v_first)
            lam = self.hook_v_mix(self.v_mix)
            v = (1 - lam) * v + lam * v_first if lam.numel() == 1 else lam[1] * v + lam[0] * v_first

        sink = None
        if self.abstention == "sinklogit":
            sink = self.hook_sink_logit(self.sink)
        elif self.abstention == "offbyone":
            sink = self.hook_sink_logit(q.new_zeros(self.n_heads, dtype=torch.float32))

        v_out, key_bias = apply_gate(self.gate, v, xv, self.hook_v_gate)  # fires hook_v_gate on gated heads
        if self.forget is not None:  # FoX: -c_j (B,Hkv,T) beside a routing gate's log g_j
            forget = self.forget(xq, self.hook_forget_gate)
            key_bias = forget if key_bias is None else key_bias + forget
        if v_out is v_first and v_out is not None and self.hook_v_out.has_hooks():  # ungated layer 0 of a value
            v_out = v_out.clone()  # residual: V_1 is kept for the later layers, so an in-place edit stays this layer's
        v_out = self.hook_v_out(v_out)
        edit = edits.taken(self.hook_v_out)  # a knockout or eviction a hook on hook_v_out handed to this layer's op
        out = self._attend(q, k, v_out, sink, key_bias, edit)  # B,T,H,dv
        out = apply_out_gate(self.out_gate, out, xq, self.hook_out_gate)  # Y ⊙ σ(x W_g), fires hook_out_gate
        z = self.hook_z(out)
        out, key = self._project_out(z)  # B,T,d and B,T,r (P-LR) or None
        return out, key, v_first

    def _query_key(self, xq: torch.Tensor, xk: torch.Tensor):
        """q (B,T,H,dh), k (B,T,Hkv,dh) as the scores take them, through hook_q/k (the projections), hook_q/k_normed
        (after QK-norm, where there is one) and hook_rot_q/k (after rotary): an edit at any point propagates."""
        B, T, _ = xq.shape
        q = self.q_proj(xq).view(B, T, self.q_heads, self.d_head)
        k = self.k_proj(xk).view(B, T, self.k_heads, self.d_head)
        if self.diff is not None:  # the authors' interleaved pairs (head h's branches at 2h, 2h + 1) -> branch-major
            q, k = _branch_major(q), _branch_major(k)
        if self.qk_activation != "none":  # GatedV placement controls: part of the projection, applied before RoPE
            q = F.silu(q)
            k = F.silu(k) if self.qk_activation == "qk" else k
        q, k = self.hook_q(q), self.hook_k(k)  # rot_q = rotary(q_normed or q) holds with the activation inside
        if self.q_norm is not None:
            q, k = self.hook_q_normed(self.q_norm(q)), self.hook_k_normed(self.k_norm(k))
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        return self.hook_rot_q(q), self.hook_rot_k(k)

    def _attend(self, q, k, v_out, sink, key_bias, edit=None) -> torch.Tensor:
        """The attention op's output (B,T,H,dv) with the lazy hooks: hook_attn_scores, hook_pattern, hook_phantom,
        hook_pattern_norm and hook_lse fire only when hooked (or materialising); otherwise the op's fused path runs and
        nothing T×T is stored. An edit of the scores or of the pattern reaches the output."""
        need_scores = self.materialize or self.hook_attn_scores.has_hooks()
        need_pattern = (
            need_scores
            or self.materialize
            or any(p.has_hooks() for p in (self.hook_pattern, self.hook_phantom, self.hook_pattern_norm))
        )
        need_lse = self.materialize or self.hook_lse.has_hooks()
        if self.diff is not None:
            return self._attend_diff(q, k, v_out, edit, need_scores, need_pattern)
        if self.rule is not None:
            return self._attend_rule(q, k, v_out, key_bias, edit, need_scores, need_pattern)
        res = sink_attention(
            q,
            k,
            v_out,
            sink=sink,
            key_bias=key_bias,
            return_pattern=need_pattern,
            return_lse=need_lse,
            backend="reference" if need_pattern else None,
            edit=edit,  # carried out by the op, whose pattern shows it
        )  # None: the runtime backend
        if need_scores:
            res = self._fire_scores(res, q, k, v_out, sink, key_bias, edit is not None)
        out = res.out  # B,T,H,dv
        if need_lse:
            self.hook_lse(res.lse_real)  # docs/definitions.md#row-log-normaliser
        if need_pattern:
            pattern, edited = fire(self.hook_pattern, res.pattern)
            self.hook_phantom(res.phantom)  # the phantom's value is 0: an edit of its mass changes no output
            if edited:  # a hook edited the pattern (replaced it or wrote into it): aggregate with the edited one
                out = apply_pattern(pattern, v_out, q.dtype)
            self._fire_pattern_norm(pattern, v_out)
        return out

    def _attend_rule(self, q, k, v_out, key_bias, edit, need_scores: bool, need_pattern: bool) -> torch.Tensor:
        """The output (B,T,H,dv) under a row rule other than softmax, with hook_attn_scores (scale·q·k, the rule's
        constant bias not included), hook_pattern (the weight each key gets) and, where rows sum to at most one,
        hook_phantom (1 - Σ_j pattern, the unspent mass) where hooked; an edit of the scores re-makes the pattern and
        the output, an edit of the pattern re-makes the output."""
        rule, bias = self.rule, self.rule_bias
        assert rule is not None
        res = rule.attention(q, k, v_out, bias=bias, key_bias=key_bias, return_pattern=need_pattern, edit=edit)
        out, pattern = res.out, res.pattern
        if need_scores:
            scores = attention_scores(q, k, key_bias=key_bias)
            fired, edited = fire(self.hook_attn_scores, scores)
            if edited:
                pattern = rule.of_scores(fired, bias=bias)
                out = apply_pattern(pattern, v_out, q.dtype)
        if need_pattern:
            fired, edited = fire(self.hook_pattern, pattern)
            if rule.at_most_one:
                self.hook_phantom(1.0 - fired.sum(-1))  # the phantom has no value: an edit of it changes no output
            if edited:
                out = apply_pattern(fired, v_out, q.dtype)
            self._fire_pattern_norm(fired, v_out)
        return out

    def _attend_diff(self, q, k, v_out, edit, need_scores: bool, need_pattern: bool) -> torch.Tensor:
        """The output (B,T,H,dv) under differential attention, after its sub-layer norm and (1 - λ_init) scale, with
        hook_lambda (H), hook_attn_scores (B,2H,T,T: both branches' scores, branch-major), hook_pattern_1 / _2 and
        hook_pattern (p1 - λ p2) where hooked. An edit of λ, the scores or a branch re-makes the net rows and the
        output; an edit of hook_pattern re-makes the output. hook_pattern_norm, hook_phantom and hook_lse do not fire
        (the norm after the difference is not linear; the rows are signed and have no phantom or log-normaliser)."""
        lam = self.hook_lambda(self.diff.lam(self.n_heads))  # type: ignore[union-attr]  # diff is set here
        need_pattern = need_pattern or self.hook_pattern_1.has_hooks() or self.hook_pattern_2.has_hooks()
        res = diff_attention(q, k, v_out, lam, return_pattern=need_pattern, edit=edit)
        out, p1, p2, net = res
        if need_scores:
            scores = attention_scores(q, k)  # B,2H,T,T
            fired, edited = fire(self.hook_attn_scores, scores)
            if edited:
                p1, p2 = patterns_of_scores(fired)
        if need_pattern:
            (f1, edited_1), (f2, edited_2) = fire(self.hook_pattern_1, p1), fire(self.hook_pattern_2, p2)
            if edited_1 or edited_2 or p1 is not res.pattern_1:  # an edited branch, or branches of edited scores
                net = net_pattern(f1, f2, lam)
            fired, edited = fire(self.hook_pattern, net)
            if edited or net is not res.pattern:
                out = apply_pattern(fired, v_out, q.dtype)
        return self.diff.finish(out)  # type: ignore[union-attr]

    def _fire_pattern_norm(self, pattern, v_out) -> None:
        """hook_pattern_norm (B,H,Tq,Tk): ||a_ij v_out_j W_O[h]|| of the pattern the output was aggregated with,
        before any output gate (docs/definitions.md#norm-weighted-attention); a read-out, its edit changes nothing."""
        if self.materialize or self.hook_pattern_norm.has_hooks():
            self.hook_pattern_norm(pattern_norms(pattern, v_out, self.o_proj.weight))

    def _fire_scores(self, res, q, k, v_out, sink, key_bias, edited_by_op: bool):
        """hook_attn_scores on the scores (B,H,Tq,Tk): scale·q·k + key bias, hidden keys -inf (under an attention
        edit, the scores the op took, read back from its pattern). An edit of them re-makes the pattern, the
        phantom, the real-key lse and the output from the edited scores."""
        scores = scores_of_probs(res.pattern, res.lse) if edited_by_op else attention_scores(q, k, key_bias=key_bias)
        fired, edited = fire(self.hook_attn_scores, scores)
        if not edited:
            return res
        pattern, phantom, _ = probs_of_scores(fired, sink)
        real = fired.logsumexp(-1) if res.lse_real is not None else None  # B,H,Tq over the real keys
        return res._replace(out=apply_pattern(pattern, v_out, q.dtype), pattern=pattern, phantom=phantom, lse_real=real)

    def _project_out(self, z: torch.Tensor):
        """(output B,T,d, P-LR key B,T,r or None) of the head outputs z (B,T,H,dv). hook_result (B,T,H,d: z_h W_O[h])
        fires only when hooked (or materialising); an edit of it makes the output Σ_h result_h + b_O."""
        B, T = z.shape[:2]
        flat = z.reshape(B, T, self.n_heads * self.d_value)
        out, key = project_with_key(flat, self.o_proj, self.key_proj)
        if not (self.materialize or self.hook_result.has_hooks()):
            return out, key
        w = self.o_proj.weight.view(-1, self.n_heads, self.d_value)  # d, H, dv
        result = torch.einsum("bthe,dhe->bthd", z, w)  # B,T,H,d
        fired, edited = fire(self.hook_result, result)
        if edited:  # an edited write: the output is the sum of the edited heads' writes
            out = fired.sum(2) if self.o_proj.bias is None else fired.sum(2) + self.o_proj.bias
        return out, key


def _branch_major(x: torch.Tensor) -> torch.Tensor:
    """(B,T,2N,dh) with head n's two branches at 2n and 2n + 1 (the authors' view) -> (B,T,2N,dh) with branch b of
    head n at b·N + n (the op's layout: one GQA softmax over the 2N heads gives both branches)."""
    B, T, n2, dh = x.shape
    return x.view(B, T, n2 // 2, 2, dh).transpose(2, 3).reshape(B, T, n2, dh)
