"""TransformerLens's vocabulary beyond attention on HF checkpoints (docs/definitions.md#hook-namespace), fired by
module hooks on the model's own modules: each block's norms (``ln1`` / ``ln2`` / ``ln1_post`` / ``ln2_post``
``.hook_scale`` / ``.hook_normalized``) and the final norm's (``ln_final``), the MLP's pre-activation, linear branch
and activation (``mlp.hook_pre`` / ``hook_pre_linear`` / ``hook_post``), a mixture of experts' routing
(``mlp.hook_router_logits`` / ``hook_expert_indices`` / ``hook_expert_weights``), the learned position embedding
(``hook_pos_embed``) and what the LM head reads (``unembed.hook_in``).

Nothing is named by guesswork. A norm is described by the one form (centred or not; gain w, Gemma's 1 + w or none;
bias; eps) that reproduces the module's own output on a test input; an MLP by the projections and activation whose
composition reproduces, on a dry run of the module, what its output projection reads; a router by the (logits, top-k
weights, top-k experts) it returns, its routing shown to follow from the logits alone. What cannot be described so
gets no hook point, and ``ModelInfo.absent_hooks`` lists it.

Edits propagate. hook_scale / hook_normalized: the norm's output is recomputed from the edited tensor, (x − mean) /
scale' · gain + bias (an unedited norm keeps HF's output). The MLP points are the projections' own outputs and the
output projection's input. An edited router logit re-runs the router's own code from those logits; edited expert
indices and weights are what the experts receive (hook_expert_weights is read back at the chosen experts). The norm
points are computed only when a hook watches them (as the attention's pattern), so the plain forward is HF's.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from probe.hooks import names
from probe.hooks.fire import fire
from probe.models.layers import NormPoints, UnembedPoints

# module.__dict__ entries (never registered submodules, so a structural copy drops them with the hooks)
NORM_KEY = "_probe_norm"  # norm -> its NormHooks
BRANCH_KEY = "_probe_mlp_branch"  # gate / up projection -> (the block's MLPHooks, "hook_pre" or "hook_pre_linear")
FUSED_KEY = "_probe_mlp_fused"  # fused gate-and-up projection -> (the block's MLPHooks, gate half first)
POST_KEY = "_probe_mlp_post"  # output projection -> the block's MLPHooks
MLP_KEY = "_probe_mlp_shape"  # MLP module -> the block's MLPHooks (its input's B,T, for the router's flat tokens)
ROUTER_KEY = "_probe_router"  # router -> the block's MLPHooks
POSITION_KEY = "_probe_pos_embed"  # position embedding -> the adapter's Positions
BATCH_KEY = "_probe_batch"  # input embedding -> the adapter's Positions (the batch its B,T,d output has)
UNEMBED_KEY = "_probe_unembed"  # LM head -> the adapter's UnembedPoints

EPS_NAMES = ("eps", "variance_epsilon", "epsilon", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")
EPS_GUESSES = (1e-5, 1e-6, 1e-8, 1e-12, 0.0)  # norms that hard-code theirs (OLMo's LayerNorm: 1e-5)
GAINS = ("weight", "one_plus_weight")  # out = normalized · w (most) or · (1 + w) (Gemma, Qwen3-Next)
# per-row relative; bf16 / fp16: HALF_TOLERANCE. fp64 as fp32: HF norms and routers compute in fp32 whatever the
# model's dtype (LlamaRMSNorm's .to(torch.float32)), so an fp64 model's norm is fp32-close to its formula
TOLERANCE = {torch.float64: 1e-5, torch.float32: 1e-5}
HALF_TOLERANCE = 2e-2

# (gate or sole input projection, linear branch or None, output projection) of dense MLPs, as HF names them
PROJECTIONS = (
    ("gate_proj", "up_proj", "down_proj"),
    ("w1", "w3", "w2"),
    ("wi_0", "wi_1", "wo"),
    ("gate_up_proj", None, "down_proj"),
    ("up_proj", None, "down_proj"),
    ("c_fc", None, "c_proj"),
    ("fc1", None, "fc2"),
    ("dense_h_to_4h", None, "dense_4h_to_h"),
    ("fc_in", None, "fc_out"),
    ("linear_fc1", None, "linear_fc2"),
    ("Wi", None, "Wo"),
)
ACTIVATIONS = ("act_fn", "activation_fn", "act", "activation", "gelu_impl", "activation_function")
# an MLP that calls its activation inline (LFM2's F.silu): the dry run must single out one of these
INLINE_ACTIVATIONS = (F.silu, F.gelu, lambda x: F.gelu(x, approximate="tanh"), F.relu, lambda x: F.relu(x).square())
ROUTERS = ("gate", "router")  # an MoE block's router submodule
POSITION_EMBEDDINGS = ("wpe", "embed_positions")  # learned absolute positions beside the layers (GPT-2, OPT, BioGPT)
DENSE_POINTS, ROUTER_POINTS = ("pre", "pre_linear", "post"), ("router_logits", "expert_indices", "expert_weights")


def _below_block(hook_name: str) -> str:
    """A block hook as ModelInfo.absent_hooks spells it: 'blocks.0.mlp.hook_pre' -> 'mlp.hook_pre'."""
    return hook_name.split(".", 2)[-1]


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """got equals want row by row (last axis) within the tolerance of want's dtype."""
    if got.shape != want.shape:
        return False
    tol = TOLERANCE.get(want.dtype, HALF_TOLERANCE)
    err = (got.double() - want.double()).norm(dim=-1)
    return bool((err <= tol * want.double().norm(dim=-1)).all())


def _hook_once(module: nn.Module, key: str, target, hook, pre: bool = False, kwargs: bool = False) -> None:
    """Point ``module.__dict__[key]`` at ``target`` and register ``hook`` unless it already is (an adapter built again
    on the same model re-points the entry; the hook reads it at call time)."""
    module.__dict__[key] = target
    registered = module._forward_pre_hooks if pre else module._forward_hooks
    if hook in registered.values():
        return
    if pre:
        module.register_forward_pre_hook(hook, with_kwargs=kwargs)
    else:
        module.register_forward_hook(hook, with_kwargs=kwargs)


def _test_input(module: nn.Module, shape: tuple[int, ...]) -> torch.Tensor | None:
    """A seeded input of ``shape`` in the module's dtype on its device (None on the meta device: nothing to run)."""
    ref = next((p for p in module.parameters() if p.is_floating_point()), None)
    dtype, device = (torch.float32, torch.device("cpu")) if ref is None else (ref.dtype, ref.device)
    if device.type == "meta":
        return None
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return x.to(device=device, dtype=dtype)


# --------------------------------------------------------------------------------------------------------------
# norms


@dataclass(frozen=True)
class NormForm:
    """out = (x − centre) / scale · gain + bias, scale = √(mean((x − centre)²) + eps): centre mean(x) (LayerNorm)
    or 0 (RMSNorm); gain the module's weight, 1 + weight (Gemma) or none."""

    centred: bool
    gain: str | None  # one of GAINS, None: no gain
    bias: bool
    eps: float

    def centre(self, x: torch.Tensor) -> torch.Tensor:
        """x − mean(x) (LayerNorm) or x, in fp32 at least (HF norms compute their statistics there)."""
        x = x.to(torch.promote_types(x.dtype, torch.float32))
        return x - x.mean(-1, keepdim=True) if self.centred else x

    def scale(self, centred: torch.Tensor) -> torch.Tensor:
        return (centred.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()  # B,T,1

    def output(self, module: nn.Module, normalized: torch.Tensor) -> torch.Tensor:
        """normalized · gain + bias with the module's current parameters."""
        out = normalized
        if self.gain is not None:
            weight = module.weight.to(normalized.dtype)
            out = out * (1 + weight if self.gain == "one_plus_weight" else weight)
        return out + module.bias.to(normalized.dtype) if self.bias else out


def _eps_candidates(module: nn.Module) -> list[float]:
    named = [float(e) for n in EPS_NAMES if isinstance(e := getattr(module, n, None), (int, float))]
    return named + [e for e in EPS_GUESSES if e not in named]


def identify_norm(module: nn.Module, d: int) -> NormForm | None:
    """The NormForm that reproduces ``module`` on a test input whose rows have a mean offset (so centring shows) and
    two scales, one near √eps (so eps shows); None when no form does (or the module cannot run here)."""
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    weight = weight if isinstance(weight, torch.Tensor) and weight.shape == (d,) else None
    has_bias = isinstance(bias, torch.Tensor) and bias.shape == (d,)
    x = _test_input(module, (1, 6, d))
    if x is None:
        return None
    x = (x * 2 + 1.5) * torch.tensor([1.0] * 3 + [1e-3] * 3, dtype=x.dtype, device=x.device)[None, :, None]
    try:
        with torch.no_grad():
            want = module(x)
    except Exception:  # noqa: BLE001 - a module that cannot run alone (a gated norm needs its gate) is not described
        return None
    if not isinstance(want, torch.Tensor):
        return None
    gains = GAINS if weight is not None else (None,)
    for eps in _eps_candidates(module):
        for centred in (False, True):
            for gain in gains:
                form = NormForm(centred, gain, has_bias, eps)
                centred_x = form.centre(x.double())
                if _close(form.output(module, centred_x / form.scale(centred_x)).to(want.dtype), want):
                    return form
    return None


class NormHooks(NormPoints):
    """One HF norm's points (hook_scale B,T,1; hook_normalized B,T,d, before the gain and bias) and its form."""

    def __init__(self, form: NormForm):
        super().__init__()
        self.form = form

    def fire(self, module: nn.Module, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor | None:
        """Fire both points on the norm of x; the norm's output recomputed from them when a hook edited either (an
        edited scale divides the centred x again), else None (HF's output stands)."""
        centred = self.form.centre(x)  # B,T,d
        scale, scale_edited = fire(self.hook_scale, self.form.scale(centred))  # B,T,1
        normalized, edited = fire(self.hook_normalized, centred / scale)  # B,T,d
        if not (scale_edited or edited):
            return None
        return self.form.output(module, normalized).to(out.dtype)


def norm_hook(module, args, kwargs, output):
    """Forward hook on a norm: fires its NormHooks where a hook watches them (the norm's input is its first
    argument, positional or keyword)."""
    hooks = module.__dict__.get(NORM_KEY)
    if hooks is None or not isinstance(output, torch.Tensor) or not hooks.watched():
        return None
    x = args[0] if args else next(iter(kwargs.values()), None)
    return None if x is None else hooks.fire(module, x, output)


def _install_norm(owner: nn.Module, attr: str, module: nn.Module, d: int) -> bool:
    """Describe ``module``, give ``owner`` its NormHooks as ``attr`` and hook it; False where it cannot be described."""
    form = identify_norm(module, d)
    if form is None:
        return False
    owner.add_module(attr, NormHooks(form))
    _hook_once(module, NORM_KEY, getattr(owner, attr), norm_hook, kwargs=True)
    return True


def _block_norms(adapter, layer: int, decoder_layer: nn.Module, block: nn.Module, d: int) -> tuple[set, set]:
    """The block's norms (``adapter.norm_module``): (points fired, points lacked). A family that names no norms (the
    generic route) lacks ln1 and ln2 where its layer has norm modules: they exist, but their roles are unknown."""
    fired, lacked = set(), set()
    for which in names.NORMS:
        module = adapter.norm_module(layer, which)
        if module is None:
            continue
        points = {_below_block(names.norm(layer, which, p)) for p in names.NORM_POINTS}
        (fired if _install_norm(block, which, module, d) else lacked).update(points)
    if not adapter.norm_names() and any("norm" in type(c).__name__.lower() for c in decoder_layer.children()):
        lacked |= {_below_block(names.norm(layer, w, p)) for w in ("ln1", "ln2") for p in names.NORM_POINTS}
    return fired, lacked


def _final_norm(adapter, d: int) -> tuple[set, set]:
    module = adapter.norm_module(None)
    if module is None:
        return set(), set()
    points = {names.norm(None, point=p) for p in names.NORM_POINTS}
    return (points, set()) if _install_norm(adapter, names.FINAL_NORM, module, d) else (set(), points)


# --------------------------------------------------------------------------------------------------------------
# MLPs


@dataclass(frozen=True)
class MLPPlan:
    """Where a dense MLP's points are: ``pre`` the gate (or sole) input projection, ``linear`` the up projection of
    a gated MLP, ``post`` the output projection whose input is hook_post; ``fused`` "gate_first" / "up_first": pre's
    output is both branches side by side (Phi-3's gate_up_proj)."""

    pre: str
    linear: str | None
    post: str
    fused: str | None = None

    @property
    def points(self) -> tuple[str, ...]:
        return DENSE_POINTS if self.linear or self.fused else ("pre", "post")

    def activation_input(self, seen: dict, act) -> torch.Tensor:
        """What the plan says the output projection reads, from the dry run's projection outputs."""
        pre = seen[self.pre]
        if self.fused:
            first, second = pre.chunk(2, dim=-1)
            gate, up = (first, second) if self.fused == "gate_first" else (second, first)
            return act(gate) * up
        return act(pre) * seen[self.linear] if self.linear else act(pre)


def _dry_run(host: nn.Module, d: int, inputs: tuple[str, ...], post: str) -> dict | None:
    """Run ``host`` on a (1, 2, d) input recording the outputs of ``inputs`` and the input of ``post``; None when
    it cannot run alone or a projection is not called exactly once."""
    x = _test_input(host, (1, 2, d))
    if x is None:
        return None
    seen: dict[str, list] = {}
    handles = [
        getattr(host, n).register_forward_hook(lambda _m, _a, out, n=n: seen.setdefault(n, []).append(out))
        for n in inputs
    ]
    handles.append(getattr(host, post).register_forward_pre_hook(lambda _m, a: seen.setdefault(post, []).append(a[0])))
    try:
        with torch.no_grad():
            try:
                host(x)
            except TypeError:  # BLOOM's and MPT's MLPs add the residual they are handed (a zero one here)
                host(x, torch.zeros_like(x))
    except Exception:  # noqa: BLE001 - an MLP that does not run alone is not described
        return None
    finally:
        for h in handles:
            h.remove()
    if any(len(seen.get(n, ())) != 1 for n in (*inputs, post)):
        return None
    return {n: v[0] for n, v in seen.items()}


def identify_mlp(host: nn.Module, d: int) -> MLPPlan | None:
    """The plan whose composition (with the module's own activation) reproduces what the output projection reads
    on a dry run of ``host``; None when none does (an unknown structure, a norm inside the MLP, an MoE block)."""
    own = next((a for n in ACTIVATIONS if callable(a := getattr(host, n, None))), None)
    acts = (own,) if own is not None else INLINE_ACTIVATIONS
    for pre, linear, post in PROJECTIONS:
        if not all(isinstance(host._modules.get(n), nn.Module) for n in (pre, linear, post) if n is not None):
            continue
        seen = _dry_run(host, d, (pre,) if linear is None else (pre, linear), post)
        if seen is None or seen[pre].dim() != 3:
            continue
        plans = (
            [MLPPlan(pre, linear, post)]
            if linear
            else [MLPPlan(pre, None, post)] + [MLPPlan(pre, None, post, order) for order in ("gate_first", "up_first")]
        )
        with torch.no_grad():
            found = [p for p in plans for a in acts if _close(seen[post], p.activation_input(seen, a))]
        if len(found) == 1:  # exactly one reading (an inline activation the dry run cannot tell apart: none)
            return found[0]
    return None


class MLPHooks(nn.Module):
    """One block's MLP points (``points``: of names.MLP_POINTS, those this MLP has)."""

    def __init__(self, points: tuple[str, ...]):
        super().__init__()
        self.shape: tuple[int, ...] | None = None  # B,T of the MLP's last input (the router sees B·T flat tokens)
        for point in names.MLP_POINTS:
            if point in points:
                self.add_module(f"hook_{point}", HookPoint())

    def positions(self, tokens: int) -> tuple[int, ...]:
        shape = self.shape
        return shape if shape is not None and int(torch.Size(shape).numel()) == tokens else (1, tokens)


def branch_hook(module, _args, output):
    """Forward hook on the gate or up projection: its output through hook_pre / hook_pre_linear (B,T,m)."""
    found = module.__dict__.get(BRANCH_KEY)
    return None if found is None else getattr(found[0], found[1])(output)


def fused_hook(module, _args, output):
    """Forward hook on a fused gate-and-up projection: each half through its point (in-place edits of the halves
    reach the output, which they are views of; replaced halves are joined again)."""
    found = module.__dict__.get(FUSED_KEY)
    if found is None:
        return None
    hooks, gate_first = found
    first, second = output.chunk(2, dim=-1)  # B,T,m each
    gate, up = (first, second) if gate_first else (second, first)
    new_gate, new_up = hooks.hook_pre(gate), hooks.hook_pre_linear(up)
    if new_gate is gate and new_up is up:
        return None
    return torch.cat((new_gate, new_up) if gate_first else (new_up, new_gate), dim=-1)


def post_hook(module, args):
    """Forward pre-hook on the output projection: its input through hook_post."""
    hooks = module.__dict__.get(POST_KEY)
    if hooks is None or not args:
        return None
    return (hooks.hook_post(args[0]),) + tuple(args[1:])


def _attach_plan(host: nn.Module, plan: MLPPlan, hooks: MLPHooks) -> None:
    if plan.fused:
        _hook_once(host._modules[plan.pre], FUSED_KEY, (hooks, plan.fused == "gate_first"), fused_hook)
    else:
        _hook_once(host._modules[plan.pre], BRANCH_KEY, (hooks, "hook_pre"), branch_hook)
    if plan.linear:
        _hook_once(host._modules[plan.linear], BRANCH_KEY, (hooks, "hook_pre_linear"), branch_hook)
    _hook_once(host._modules[plan.post], POST_KEY, hooks, post_hook, pre=True)


# --------------------------------------------------------------------------------------------------------------
# mixture-of-experts routers


@contextlib.contextmanager
def first_linear_returns(value: torch.Tensor):
    """Within the block, this thread's first ``F.linear`` call returns ``value`` instead: a router re-run from given
    logits (its code computes them with F.linear, its first one; :func:`identify_router` checks that)."""
    original, thread, pending = F.linear, threading.get_ident(), [True]

    def linear(*args, **kwargs):
        if pending[0] and threading.get_ident() == thread:
            pending[0] = False
            return value
        return original(*args, **kwargs)

    F.linear = linear
    try:
        yield
    finally:
        F.linear = original


def _routes(out) -> bool:
    """Whether a router's output is (logits N,E, top-k weights N,k, top-k experts N,k) as transformers' routers
    return them (Mixtral, Qwen-MoE, OLMoE, DeepSeek, gpt-oss)."""
    if not (isinstance(out, tuple) and len(out) == 3 and all(isinstance(t, torch.Tensor) for t in out)):
        return False
    logits, weights, index = out
    return (
        logits.dim() == weights.dim() == index.dim() == 2
        and logits.is_floating_point()
        and weights.is_floating_point()
        and not index.is_floating_point()
        and weights.shape == index.shape
        and index.shape[-1] <= logits.shape[-1]
    )


def identify_router(host: nn.Module, d: int) -> nn.Module | None:
    """The MoE block's router, where it returns (logits, weights, experts) and re-running it from its own logits
    (handed in for its first F.linear) returns those logits and the same routing: then an edited logit can be routed
    by the family's own code. Tried on flat tokens (N,d), then on (1,N,d) (AFMoE's router flattens them itself)."""
    router = next((r for n in ROUTERS if isinstance(r := host._modules.get(n), nn.Module)), None)
    for shape in ((3, d), (1, 3, d)):
        x = None if router is None else _test_input(router, shape)
        if x is None:
            return None
        try:
            args = (x, *_router_extras(host, router, x.shape[:-1]))
            with torch.no_grad():
                out = router(*args)
                if not _routes(out):
                    continue
                with first_linear_returns(out[0]):
                    again = router.forward(*args)
        except Exception:  # noqa: BLE001 - a router that does not run alone is not described
            continue
        if _routes(again) and again[0] is out[0] and torch.equal(again[1], out[1]) and torch.equal(again[2], out[2]):
            return router
    return None


def _router_extras(host: nn.Module, router: nn.Module, positions: tuple[int, ...]) -> list:
    """What the MoE block hands its router beside the tokens: its attributes of the names of the router's other
    required arguments (DeepSeek-style score-correction biases: ``self.gate(hidden, self.e_score_correction_bias)``
    in MiniMax-M2 and HY-V3, ``expert_bias`` in AFMoE), and token ids (``positions``, all 0) for a hash router that
    picks experts by token (DeepSeek-V4's ``input_ids``). AttributeError where the block has no such attribute."""
    params = list(inspect.signature(router.forward).parameters.values())[1:]
    required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [
        torch.zeros(positions, dtype=torch.long) if p.name == "input_ids" else getattr(host, p.name) for p in required
    ]


def shape_hook(module, args, kwargs):
    """Forward pre-hook on an MoE MLP: the B,T of its input, for the router's flat tokens."""
    hooks = module.__dict__.get(MLP_KEY)
    x = args[0] if args else next(iter(kwargs.values()), None)
    if hooks is not None and isinstance(x, torch.Tensor):
        hooks.shape = tuple(x.shape[:-1])
    return None


def router_hook(module, args, kwargs, output):
    """Forward hook on a router: its logits (B,T,E), the experts chosen (B,T,k) and their weights in each token's
    mix (B,T,E, 0 where not chosen) through the points; an edit re-routes (logits) or is what the experts get."""
    hooks = module.__dict__.get(ROUTER_KEY)
    if hooks is None or not _routes(output):
        return None
    logits, weights, index = output
    shape = hooks.positions(logits.shape[0])
    seen, logits_edited = fire(hooks.hook_router_logits, logits.view(*shape, -1))
    if logits_edited:  # the family's own routing from the edited logits
        logits = seen.reshape(logits.shape)
        with first_linear_returns(logits):
            _, weights, index = module.forward(*args, **kwargs)
    chosen, index_edited = fire(hooks.hook_expert_indices, index.reshape(*shape, -1))  # B,T,k
    mix = weights.new_zeros(*shape, logits.shape[-1]).scatter(-1, chosen, weights.reshape(*shape, -1))  # B,T,E
    mix, weights_edited = fire(hooks.hook_expert_weights, mix)
    if weights_edited:
        weights = mix.gather(-1, chosen).reshape(weights.shape).to(weights.dtype)
    if not (logits_edited or index_edited or weights_edited):
        return None
    return logits, weights, chosen.reshape(index.shape)


def _has_experts(*modules: nn.Module) -> bool:
    """A mixture of experts: an ``experts`` child, or a ``router`` (JetMoE's parallel experts)."""
    return any(("experts" in m._modules or "router" in m._modules) for m in modules if m is not None)


def _block_mlp(adapter, decoder_layer: nn.Module, block: nn.Module, d: int) -> tuple[set, set]:
    """The block's MLP points: a dense MLP's (described by a dry run, or declared inline by the adapter: OPT's
    ``inline_mlp``), a router's; (points fired, points lacked)."""
    host, inline = adapter.mlp_module(decoder_layer), getattr(adapter, "inline_mlp", None)
    plan = router = None
    if host is not None:
        plan, router = identify_mlp(host, d), identify_router(host, d)
    elif inline is not None:  # fc1 -> activation -> fc2 written out in the adapter's own layer body
        host, plan = decoder_layer, MLPPlan(inline[0], None, inline[1])
    else:
        return set(), set()
    moe = router is not None or _has_experts(host, decoder_layer)
    points = (plan.points if plan else ()) + (ROUTER_POINTS if router is not None else ())
    lacked = set(DENSE_POINTS if plan is None and not moe else ()) | set(ROUTER_POINTS if moe and not router else ())
    below = {p: _below_block(names.mlp(0, p)) for p in names.MLP_POINTS}
    if not points:
        return set(), {below[p] for p in lacked}
    block.add_module("mlp", MLPHooks(points))
    if plan is not None:
        _attach_plan(host, plan, block.mlp)
    if router is not None:
        _hook_once(host, MLP_KEY, block.mlp, shape_hook, pre=True, kwargs=True)
        _hook_once(router, ROUTER_KEY, block.mlp, router_hook, kwargs=True)
    return {below[p] for p in points}, {below[p] for p in lacked}


# --------------------------------------------------------------------------------------------------------------
# positions and the unembedding


class Positions:
    """The learned position embedding's point and the batch size of the last token embedding (GPT-2's position
    embedding is (1,T,d), broadcast over the batch; hook_pos_embed is B,T,d as TransformerLens's)."""

    def __init__(self, point: HookPoint):
        self.point = point
        self.batch: int | None = None


def batch_hook(module, _args, output):
    """Forward hook on the input embedding: remember its batch size for hook_pos_embed."""
    positions = module.__dict__.get(BATCH_KEY)
    if positions is not None and isinstance(output, torch.Tensor) and output.dim() == 3:
        positions.batch = output.shape[0]
    return None


def position_hook(module, _args, output):
    """Forward hook on the position embedding: its output (B,T,d) through hook_pos_embed."""
    positions = module.__dict__.get(POSITION_KEY)
    if positions is None or not isinstance(output, torch.Tensor):
        return None
    batch = positions.batch or output.shape[0]
    full = output
    if output.dim() == 3 and output.shape[0] == 1 and batch > 1:
        full = output.expand(batch, *output.shape[1:])  # B,T,d, a view
        if positions.point.has_hooks():  # a hook may write into it: its own copy
            full = full.clone()
    seen, edited = fire(positions.point, full)
    return seen if edited else None


def unembed_hook(module, args, kwargs):
    """Forward pre-hook on the LM head: its input through unembed.hook_in."""
    hooks = module.__dict__.get(UNEMBED_KEY)
    if hooks is None:
        return None
    if args:
        return (hooks.hook_in(args[0]),) + tuple(args[1:]), kwargs
    key = next(iter(kwargs), None)
    return None if key is None else (args, {**kwargs, key: hooks.hook_in(kwargs[key])})


def _stack_owner(hf_model: nn.Module, first_layer: nn.Module) -> nn.Module | None:
    """The module holding the decoder layers' ModuleList (where the embeddings and the final norm sit beside it)."""
    for module in hf_model.modules():
        for child in module.children():
            if isinstance(child, nn.ModuleList) and len(child) and child[0] is first_layer:
                return module
    return None


def _positions(adapter, layers) -> None:
    owner = _stack_owner(adapter.hf_model, layers[0]) if layers else None
    found = (getattr(owner, n, None) for n in POSITION_EMBEDDINGS) if owner is not None else ()
    module = next((m for m in found if isinstance(m, nn.Embedding)), None)
    if module is None:  # rotary, ALiBi, no positions: no hook_pos_embed
        return
    adapter.add_module(names.pos_embed(), HookPoint())
    positions = Positions(getattr(adapter, names.pos_embed()))
    _hook_once(module, POSITION_KEY, positions, position_hook)
    _hook_once(adapter.hf_model.get_input_embeddings(), BATCH_KEY, positions, batch_hook)


def _unembedding(adapter) -> set:
    head = adapter.hf_model.get_output_embeddings()
    if head is None:
        return {names.unembed_in()}
    hooks = UnembedPoints()
    # the container is named as TransformerLens's unembed module; HookedHF.unembed (the method) keeps its name for
    # attribute access, so it is placed in _modules directly (add_module refuses a name the class already uses)
    adapter._modules[names.unembed_in().split(".")[0]] = hooks
    _hook_once(head, UNEMBED_KEY, hooks, unembed_hook, pre=True, kwargs=True)
    return set()


def install(adapter, layers) -> None:
    """Give the adapter's hook tree the norm, MLP, router, position and unembedding points its HF model has and
    hook the modules that fire them (called from ``HookedHF._install``, before the tree is named); a point the model
    has but no layer can fire joins ``probe_info.absent_hooks``."""
    d = adapter.probe_info.d_model
    fired, lacked = set(), set()
    for l, (layer, block) in enumerate(zip(layers, adapter.blocks)):
        for got, lacks in (_block_norms(adapter, l, layer, block, d), _block_mlp(adapter, layer, block, d)):
            fired |= got
            lacked |= lacks
    got, lacks = _final_norm(adapter, d)
    fired, lacked = fired | got, lacked | lacks | _unembedding(adapter)
    _positions(adapter, layers)
    absent = adapter.probe_info.absent_hooks
    absent += [point for point in sorted(lacked - fired) if point not in absent]
