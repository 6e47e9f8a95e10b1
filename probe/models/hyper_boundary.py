"""A hyper-connected model's boundaries fused: one sub-layer's write and the next sub-layer's read (or the head's
collapse) as one autograd node (docs/definitions.md#hyper-connections, "Boundaries").

Between sub-layer k's output f and sub-layer k + 1's input, the unfused path (probe/models/hyper.py) writes the new
streams Y = H_res X + H_post ⊗ f, computes the next connection's weights from Y (a normed projection of its streams
for dynamic HC and mHC), and reads Σ_j pre_j Y_j: five passes over the (B,T,n,d) streams forward, and backward three
gradients of Y (the next write's, the read's, the projection's) that autograd adds in two more. On a CPU these
passes over memory, not the arithmetic, set a hyper-connected step's time. Fused, the forward is one pass (the write,
the projections of each token's new streams while they sit in L1, the read weights from them by the mechanism's
``pre_rule``, the read) and the backward one (the read's weight gradients, then Y's whole gradient per token in a
buffer, pushed straight through the write's backward), with the weights' own small graph (sigmoid, tanh, Sinkhorn on
(B,T,n,n)) differentiated by autograd inside, or by the mechanism itself where it says how (``taped_grads``: dynamic
HC, and mHC in C). On the tiny tier this gains 0.01-0.04 of the baseline's throughput
(benchmarks/hyper_throughput.py's "unfused" rows, docs/results/benchmarks.md), less than the passes it saves
suggest.

The fused path runs where it cannot be seen: the C kernels take the tensors (CPU, fp32 / fp64, the default backend)
and the model's stream hook points have no hooks and are not materialised (``fusable``); otherwise the model runs
the blocks' own read and write, which fire every hook. The two compute the same sums in another order
(tests/models/test_hyper_boundary.py compares logits and every gradient).
"""

from __future__ import annotations

import torch

from probe.kernels import hyper_streams
from probe.kernels.backend import current_backend
from probe.kernels.common import first_order_only
from probe.models.hyper import HyperConnection


def fusable(model) -> bool:
    """Can ``model``'s hyper-connected forward run fused: default backend, C kernels built, and no hook on (nor
    materialisation of) any point the fused path skips: each block's stream and sum points and its connections'
    weights and reads, and the head's collapse."""
    if current_backend() != "auto" or not hyper_streams.enabled():
        return False
    for blk in model.blocks:
        if blk.materialize:
            return False
        points = [blk.hook_streams, blk.hook_streams_mid, blk.hook_resid_pre, blk.hook_resid_mid, blk.hook_resid_post]
        for hc in (blk.hc_attn, blk.hc_mlp):
            points += [hc.hook_pre, hc.hook_post, hc.hook_res, hc.hook_read]
        if any(_watched(p) for p in points):
            return False
    return not _watched(model.hc_head.hook_pre)


def _watched(point) -> bool:
    """A TransformerLens hook, or a plain torch hook, on ``point``."""
    return point.has_hooks() or bool(point._forward_hooks or point._forward_pre_hooks or point._backward_hooks)


def boundary(streams: torch.Tensor, out: torch.Tensor, mix, reader):
    """Sub-layer output ``out`` (B,T,d) written into ``streams`` (B,T,n,d) with ``mix`` = (post, res), then read by
    ``reader`` (the next HyperConnection, or the head). Returns (new streams, the reader's output (B,T,d), the next
    mix, or None after the head). Fused where the kernels take the tensors, else the unfused write and read."""
    post, res = mix
    post, res = post.to(out.dtype).contiguous(), res.to(streams.dtype).contiguous()
    if not hyper_streams.takes_boundary(streams, out, post, res):
        new = HyperConnection.write(streams, out, mix)
        if isinstance(reader, HyperConnection):
            read, next_mix = reader.read(new)
            return new, read, next_mix
        return new, reader(new), None
    params = tuple(p for p in reader.parameters() if p.requires_grad) if torch.is_grad_enabled() else ()
    new, read, next_post, next_res = _Boundary.apply(streams, out, post, res, reader, *params)
    return new, read, (next_post, next_res) if next_post is not None else None


def _project_and_weigh(streams, out, post, res, reader, track: bool, taped: bool):
    """The fused forward: (new streams, read, pre, the reader's weights (pre, post, res), the projection's saved
    values, the small graph to differentiate). ``track``: build the weights' graph (autograd will ask for the
    backward). Weights that read nothing of the streams (static HC, the stream sum) are known before the write;
    those that do give their read weights' rule (``pre_rule``), which the kernel follows per token. ``taped``: the
    reader takes its weights' gradients itself (``_tapes``)."""
    dtype, lead = streams.dtype, streams.shape[:2]
    with torch.set_grad_enabled(track and not taped):  # taped: the reader differentiates its own weights
        spec = reader.projection(dtype)
    if spec is None:  # weights that are the parameters (summed_grads) need no graph
        with torch.set_grad_enabled(track and not hasattr(reader, "summed_grads")):
            weights = reader.weights_from_logits(None, lead, dtype)
        pre = weights[0].detach().to(dtype).contiguous()
        new, _, _, read, _, _ = hyper_streams.boundary_forward(streams, out, post, res, None, 1, 0.0, pre)
        return new, read, pre, weights, (None, None, None, None), (None, None, 1)
    proj, groups, eps = spec  # L, k
    rule = reader.pre_rule(dtype)
    assert rule is not None, f"{type(reader).__name__} projects the streams but gives no pre_rule"
    rows = proj.detach().T.contiguous()  # k, L: each logit's weights contiguous for the kernel
    new, dots, inv_rms, read, pre, slope = hyper_streams.boundary_forward(
        streams, out, post, res, rows, groups, eps, rule=rule
    )
    logits = dots * inv_rms.unsqueeze(-1)  # B,T,groups,k: the normed projection
    if taped:
        post, res, tape = reader.taped_weights(logits, dtype)
        return new, read, pre, (pre, post, res), (rows, dots, inv_rms, slope), (tape, None, rule[-1])
    logits.requires_grad_(track)
    with torch.set_grad_enabled(track):
        weights = reader.weights_from_logits(logits, lead, dtype)  # pre again, for its parameters' gradients
    return new, read, pre, weights, (rows, dots, inv_rms, slope), (logits, proj, rule[-1])


class _Boundary(torch.autograd.Function):
    """The fused boundary as one autograd node; ``params`` are the reader's trainable parameters, whose gradients
    come from its weights' small graph (and the projection's) rebuilt in the forward, or from the reader's own
    ``taped_grads``."""

    @staticmethod
    def forward(ctx, streams, out, post, res, reader, *params):
        track = any(ctx.needs_input_grad)
        ctx.taped = _tapes(reader, streams)
        new, read, pre, weights, projected, graph = _project_and_weigh(
            streams, out, post, res, reader, track, ctx.taped
        )
        ctx.graph, ctx.weights, ctx.params, ctx.reader = graph, weights, params, reader
        ctx.save_for_backward(streams, out, post, res, new, pre, *projected)
        _, next_post, next_res = (None if w is None else w.detach() for w in weights)
        return new, read, next_post, next_res

    @staticmethod
    @first_order_only
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_new, grad_read, grad_post, grad_res):
        streams, out, post, res, new, pre, rows, dots, inv_rms, slope = ctx.saved_tensors
        (logits, proj, step), params = ctx.graph, ctx.params
        if grad_read is None:
            grad_read = torch.zeros_like(new[..., 0, :])
        tensors = (grad_new, grad_read, pre, new, streams, out, post, res)
        if logits is None:  # the weights do not depend on Y: the read's weight gradient comes from the same pass
            *grads, grad_pre, _ = hyper_streams.boundary_backward(*tensors)
            if hasattr(ctx.reader, "summed_grads"):
                summed = ctx.reader.summed_grads(grad_pre, grad_post, grad_res)
                return (*grads, None, *(summed.get(p) for p in params))
            return (*grads, None, *_grads(_pairs(ctx.weights, (grad_pre, grad_post, grad_res)), list(params)))
        if ctx.taped:  # ``logits`` is the reader's tape: post's and res's share by the reader's own derivative
            grad_logits, found = ctx.reader.logits_grad(logits, grad_post, grad_res), None
        else:  # post's and res's share of the logits' gradient first (the graph kept for pre's parameters after)
            pairs = _pairs((None, *ctx.weights[1:]), (None, grad_post, grad_res))
            found = _grads(pairs, [logits, *params], keep=True)
            grad_logits = found[0].contiguous() if found[0] is not None else torch.zeros_like(logits)
        projected = (rows, dots, inv_rms, grad_logits)  # the kernel adds pre's share to grad_logits, in place
        *grads, grad_pre, grad_dots = hyper_streams.boundary_backward(*tensors, projected, slope, step)
        if ctx.taped:  # the projection's gradient and the reader's own derivative
            if not params:  # a frozen connection
                return (*grads, None)
            grad_proj = _projection_grad(grad_dots, new, rows)
            taken = ctx.reader.taped_grads(logits, grad_pre, grad_post, grad_res, grad_proj)
            return (*grads, None, *(taken.get(p) for p in params))
        last = _pairs(ctx.weights[:1], (grad_pre,))  # pre's share and the projection's, in one pass of autograd
        if _tracked(proj):  # the projection's gradient back to its parameters
            last.append((proj, _projection_grad(grad_dots, new, rows)))
        grad_params = [_add(a, b) for a, b in zip(found[1:], _grads(last, list(params)), strict=True)]
        return (*grads, None, *grad_params)


def _tapes(reader, streams) -> bool:
    """Does ``reader`` take its weights' gradients itself (``taped_grads``) at a boundary over ``streams``: where it
    has them and, where it says when (``tapes``: mHC's C kernels), there."""
    return hasattr(reader, "taped_grads") and (not hasattr(reader, "tapes") or reader.tapes(streams))


def _projection_grad(grad_dots, new, rows):
    """The projection's gradient (L, k), Σ_t dots' gradient (B,T,groups,k) ⊗ the new streams' group Y_g (L values);
    ``rows`` is the projection as the kernel took it (k, L)."""
    k, size = rows.shape
    return (grad_dots.reshape(-1, k).T @ new.reshape(-1, size)).T  # k, L first: twice as fast as L, k


def _pairs(weights, grads) -> list:
    """(weight, its gradient) where both are there and the weight is part of a graph."""
    return [(w, g) for w, g in zip(weights, grads) if _tracked(w) and g is not None]


def _tracked(t) -> bool:
    return t is not None and t.requires_grad


def _grads(pairs, leaves, keep: bool = False) -> list:
    """d(Σ ⟨output, grad⟩)/d leaf for each leaf (None where unused); ``keep``: the graph stays for another call."""
    wanted = [i for i, leaf in enumerate(leaves) if leaf.requires_grad]
    found = [None] * len(leaves)
    if pairs and wanted:
        outputs, grads = zip(*pairs, strict=True)
        got = torch.autograd.grad(outputs, [leaves[i] for i in wanted], grads, retain_graph=keep, allow_unused=True)
        for i, g in zip(wanted, got, strict=True):
            found[i] = g
    return found


def _add(a, b):
    return b if a is None else a if b is None else a + b
