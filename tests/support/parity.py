"""Parity of probe's HF adapters with HF eager on a tiny random config of one ``model_type``: the checks behind the
coverage table (probe/checkpoints/coverage.json, docs/reference/architectures.md).

:func:`check` runs, on the tiny config ``probe.checkpoints.tiny`` builds from transformers' own config class with the
family's features switched on:

* logits of the adapter's fast path and of its every-hook path against the HF eager forward, fp32 (<= 1e-5) and
  fp64 (<= 1e-10);
* ``hook_pattern`` against the attention weights HF eager returns (``output_attentions``), every softmax layer;
* every hook point the adapter created fires, with the documented shapes;
* a ``run_with_hooks`` edit of ``hook_v`` against the same edit made inside HF's own eager attention function;
* streaming sink statistics, Sink^ε and exposure against their pattern-based references, and every other analysis
  that applies to an HF checkpoint (massive activations, dormant heads, injection, the backcopy split, ablations,
  the context sweep, window losses) running to finite numbers.

The record says ``supported`` (all of that passes and no hook point is missing), ``partial`` (parity passes; the
hooks it lacks are listed, and the analyses that need them refuse by capability) or ``refused`` (why, in one line).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import math
import time
from pathlib import Path

import torch

TOL = {"fp32": 1e-5, "fp64": 1e-10}
B, T = 2, 12  # T is longer than the tiny sliding window (4): sliding layers really cut keys
EDIT_POSITION, EDIT_FACTOR = 3, 2.5
STANDARD_POINTS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out")
ATTN_POINTS = ("hook_q", "hook_k", "hook_v", "hook_v_out", "hook_pattern", "hook_phantom", "hook_lse", "hook_z")


class Refused(Exception):
    """A check that failed: the type is refused with this one-line reason."""


# causal-LM heads of models that are decoders only inside an encoder-decoder (their configs say nothing of it)
DECODERS_OF_ENCODER_DECODERS = {"trocr": "a vision encoder-decoder", "bert-generation": "a BERT encoder-decoder"}


def kind_of(model_type: str) -> str:
    """decoder-only, encoder (a masked-LM family with a causal head) or encoder-decoder (the decoder of a seq2seq
    model)."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "encoder"
    if model_type in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES or model_type in DECODERS_OF_ENCODER_DECODERS:
        return "encoder-decoder"
    try:
        config = CONFIG_MAPPING[model_type]()
    except Exception:  # noqa: BLE001 - a config class whose defaults do not validate: judged on its model
        return "decoder-only"
    return "encoder-decoder" if getattr(config, "is_encoder_decoder", False) else "decoder-only"


def ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(2, 90, (B, T), generator=torch.Generator().manual_seed(seed))


def windows(seed: int = 1, batches: int = 1) -> torch.Tensor:
    """Evaluation batches of B windows of T + 1 tokens."""
    return torch.randint(2, 90, (batches, B, T + 1), generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


STAGE_SECONDS: dict[str, float] = {}  # summed over check() calls, for sizing the CI run


def _stage(name: str, fn, *args):
    start = time.perf_counter()
    try:
        return fn(*args)
    except Refused:
        raise
    except Exception as e:  # noqa: BLE001 - whatever fails is the type's reason, in one line
        text = " ".join(str(e).split())
        raise Refused(f"{name}: {type(e).__name__}: {text[:240]}") from None
    finally:
        STAGE_SECONDS[name] = STAGE_SECONDS.get(name, 0.0) + time.perf_counter() - start


def _hf_eager(model_type: str, dtype):
    from probe.checkpoints.tiny import tiny_model

    return tiny_model(model_type, dtype=dtype)


@contextlib.contextmanager
def fp64_throughout():
    """HF's eager code casts to fp32 in places whatever the model's dtype (``softmax(..., dtype=torch.float32)``, a
    score matrix ``.float()``, GPT-Neo's ``query.to(torch.float32)``): an fp64 comparison runs with those casts of
    fp64 tensors lifted, on both sides, so it measures the attention's math and not fp32 rounding in the reference.
    Tensors of other dtypes are cast as asked."""
    softmax, to, to_float = torch.nn.functional.softmax, torch.Tensor.to, torch.Tensor.float

    def wide_softmax(input, dim=None, _stacklevel=3, dtype=None):
        if dtype == torch.float32 and input.dtype == torch.float64:
            dtype = torch.float64
        return softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    def wide_to(self, *args, **kwargs):
        if self.dtype == torch.float64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
        return to(self, *args, **kwargs)

    def wide_float(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else to_float(self, *args, **kwargs)

    torch.nn.functional.softmax, torch.Tensor.to, torch.Tensor.float = wide_softmax, wide_to, wide_float
    try:
        yield
    finally:
        torch.nn.functional.softmax, torch.Tensor.to, torch.Tensor.float = softmax, to, to_float


def _logits(ref, m, x, dtype_name: str) -> dict:
    with torch.no_grad(), fp64_throughout():  # both sides: a router's fp32 softmax is lifted in each
        want = ref(x).logits
        if not torch.isfinite(want).all() or want.abs().max() < 0.05:
            raise Refused(f"HF eager {dtype_name}: logits degenerate (max |logit| {float(want.abs().max()):.3g})")
        fast = max_diff(m(x).logits, want)
        out, cache = m.run_with_cache(x)
        hooked = max_diff(out, want)
    tol = TOL[dtype_name]
    for what, d in (("fast path", fast), ("every-hook path", hooked)):
        if not d <= tol:
            raise Refused(f"logits {dtype_name} ({what}) differ from HF eager by {d:.3g} > {tol:g}")
    return {f"logits_{dtype_name}": max(fast, hooked)}, cache


def _every_hook_fires(m, cache) -> None:
    from probe.hooks import names

    info = m.probe_info
    missing = sorted(set(m.hook_dict) - set(cache))
    if missing:
        raise Refused(f"hook points that never fire: {', '.join(missing[:4])}")
    d = info.d_model
    for name, t in cache.items():
        if name.endswith(("hook_resid_pre", "hook_resid_post", "hook_attn_out", "hook_mlp_out")):
            if tuple(t.shape) != (B, T, d):
                raise Refused(f"{name} has shape {tuple(t.shape)}, not (B, T, d) = {(B, T, d)}")
        if name.endswith("attn.hook_pattern"):  # keys: the T tokens, then any compressed entries (DeepSeek-V4)
            keys = T + info.attention_at(names.layer_of(name)).compressed_entries(T)
            if tuple(t.shape) != (B, info.n_heads, T, keys):
                raise Refused(f"{name} has shape {tuple(t.shape)}, not (B, H, T, T + compressed entries {keys - T})")


def _pattern_vs_output_attentions(ref, m, x, cache) -> dict:
    from probe.hooks import names

    with torch.no_grad():
        got = ref(x, output_attentions=True).attentions
    layers = m.probe_info.attention_layers
    if got is None or len([a for a in got if a is not None]) != len(layers):
        raise Refused("HF eager returns no attention weights for every softmax layer (output_attentions)")
    weights = [a for a in got if a is not None]

    def ours(l):  # differential attention: HF returns both branches' softmax rows, branch-major (B,2H,T,T)
        if m.probe_info.attention_rule != "diff":
            return cache[names.attn(l, "pattern")]
        return torch.cat([cache[names.attn(l, "pattern_1")], cache[names.attn(l, "pattern_2")]], dim=1)

    worst = max(max_diff(ours(l), w) for l, w in zip(layers, weights))
    if not worst <= TOL["fp32"]:
        raise Refused(f"hook_pattern differs from HF's output_attentions by {worst:.3g}")
    return {"pattern_vs_output_attentions": worst}


def _edited_eager(target):
    """An attention function running the module's own eager attention with value position EDIT_POSITION scaled by
    EDIT_FACTOR in ``target``: the edit made inside HF's module."""

    def edited(module, query, key, value, attention_mask, **kw):
        if module is target:
            value = value.clone()
            value[:, :, EDIT_POSITION] *= EDIT_FACTOR
        eager = importlib.import_module(type(module).__module__).eager_attention_forward
        return eager(module, query, key, value, attention_mask, **kw)

    return edited


def _scale_value_slice(view, index):
    """A forward hook scaling the value part of a projection's output at EDIT_POSITION: ``view`` reshapes the
    output so that ``index`` selects that position's values."""

    def hook(_module, _inputs, out):
        out = out.clone()
        view(out)[index] *= EDIT_FACTOR
        return out

    return hook


def _fused_value(attn):  # BLOOM / Falcon: query_key_value's output laid out (B, T, H, 3, dh), value last
    return _scale_value_slice(
        lambda o: o.view(*o.shape[:2], attn.num_heads, 3, -1), (slice(None), EDIT_POSITION, slice(None), 2)
    )


def _falcon_value(attn):  # Falcon's three query_key_value layouts (its _split_heads), value last
    if attn.new_decoder_architecture:
        groups = attn.num_heads // attn.num_kv_heads + 2
        return _scale_value_slice(
            lambda o: o.view(*o.shape[:2], -1, groups, attn.head_dim), (slice(None), EDIT_POSITION, slice(None), -1)
        )
    if not attn.multi_query:
        return _fused_value(attn)
    return _scale_value_slice(lambda o: o.view(*o.shape[:2], attn.num_heads + 2, -1), (slice(None), EDIT_POSITION, -1))


def _mpt_value(attn):  # MPT: Wqkv's output is q | k | v
    return _scale_value_slice(lambda o: o, (slice(None), EDIT_POSITION, slice(2 * attn.n_heads * attn.head_dim, None)))


def _projected_value(attn):  # GPT-Neo: v_proj's output
    return _scale_value_slice(lambda o: o, (slice(None), EDIT_POSITION))


# families whose attention runs outside transformers' interface: the edit on the value projection's output
OWN_VALUE_EDITS = {
    "bloom": ("query_key_value", _fused_value),
    "falcon": ("query_key_value", _falcon_value),
    "mpt": ("Wqkv", _mpt_value),
    "gpt_neo": ("v_proj", _projected_value),
}


def _value_edit(ref, m, x) -> dict:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    from probe.hooks import names

    layer = m.probe_info.attention_layers[0]
    layers = m.decoder_layers(ref)
    target = m.attention_module(layers[layer])
    if m.family in OWN_VALUE_EDITS:
        projection, make = OWN_VALUE_EDITS[m.family]
        handle = getattr(target, projection).register_forward_hook(make(target))
        try:
            with torch.no_grad():
                want = ref(x).logits
        finally:
            handle.remove()
    else:
        AttentionInterface.register("probe_test_value_edit", _edited_eager(target))
        AttentionMaskInterface.register("probe_test_value_edit", eager_mask)
        ref.set_attn_implementation("probe_test_value_edit")
        try:
            with torch.no_grad():
                want = ref(x).logits
        finally:
            ref.set_attn_implementation("eager")
    with torch.no_grad():
        base = ref(x).logits

    def scale(v, hook):
        v = v.clone()
        v[:, EDIT_POSITION] *= EDIT_FACTOR
        return v

    with torch.no_grad():
        got = m.run_with_hooks(x, fwd_hooks=[(names.attn(layer, "v"), scale)])
    moved, d = max_diff(want, base), max_diff(got, want)
    if not moved > 1e-4:
        raise Refused(f"the hook_v edit does not move HF's logits ({moved:.3g})")
    if not d <= TOL["fp32"]:
        raise Refused(f"a hook_v edit moves the logits {d:.3g} away from the same edit inside HF's attention")
    return {"value_edit": d}


def _close_tables(a, b, what: str, atol: float = 1e-5) -> float:
    x, y = a.select_dtypes("number").to_numpy(float), b.select_dtypes("number").to_numpy(float)
    if x.shape != y.shape:
        raise Refused(f"{what}: tables of shapes {x.shape} and {y.shape}")
    both = ~(torch.isnan(torch.tensor(x)) & torch.isnan(torch.tensor(y)))
    d = float((torch.tensor(x) - torch.tensor(y)).abs()[both].max()) if both.any() else 0.0
    if not d <= atol or math.isnan(d):
        raise Refused(f"{what} differ from the pattern-based reference by {d:.3g}")
    return d


def _exposure_reference(m, data, cutoffs) -> torch.Tensor:
    """Quiet-read share per (layer, head, cutoff) from materialised patterns: Σ_j pattern[t, j] · quiet[j] over rows
    t >= 1, averaged (the definition probe.analyses.inject.exposure_stats computes from row masses)."""
    from probe.analyses.inject import cutoff_fraction, quiet_and_median
    from probe.hooks import names

    info = m.probe_info
    qs = [cutoff_fraction(c) for c in cutoffs]
    out = {}
    for n in range(data.shape[0]):
        _, cache = m.run_with_cache(data[n, :, :-1], names_filter=lambda h: names.is_attn(h, "pattern", "v"))
        for l in info.attention_layers:
            pattern, v = cache[names.attn(l, "pattern")].double(), cache[names.attn(l, "v")]
            pattern = pattern[..., : v.shape[1]]  # token keys: compressed entries (DeepSeek-V4) are no quiet reads
            if info.attention_rule == "diff":  # signed rows: shares of the row's absolute mass (#signed-rows)
                pattern = pattern.abs() / pattern.abs().sum(-1, keepdim=True)
            quiet = torch.stack(quiet_and_median(v.float().norm(dim=-1), qs)[0], -1).double()  # (B, T, Hkv, m)
            quiet = quiet.repeat_interleave(info.kv_group, dim=2).permute(0, 2, 1, 3)  # (B, H, Tk, m)
            share = (pattern @ quiet)[:, :, 1:].sum((0, 2))  # (H, m)
            out[l] = out.get(l, 0) + share
    rows = data.shape[0] * data.shape[1] * (data.shape[2] - 2)
    return torch.stack([out[l] / rows for l in info.attention_layers])  # (L, H, m)


def _reference_checks(m, data) -> dict:
    """Streaming sink statistics, Sink^eps and exposure against their pattern-based references."""
    from probe.analyses.inject import exposure_stats
    from probe.analyses.sink_heads import sink_heads
    from probe.analyses.sinks import sink_stats, sink_stats_reference

    figures = {}
    fast, ref = sink_stats(m, data), sink_stats_reference(m, data)
    figures["sink_stats"] = _close_tables(fast["heads"], ref["heads"], "streaming sink statistics")
    stream, pattern = sink_heads(m, data), sink_heads(m, data, method="pattern")
    figures["sink_eps"] = _close_tables(stream["heads"], pattern["heads"], "streaming Sink^eps")
    cutoffs = ("q25", "median")
    exposure = exposure_stats(m, data, cutoffs=cutoffs)["exposure_heads"]
    got = torch.tensor(exposure["quiet_share"].to_numpy()).view(len(m.probe_info.attention_layers), -1, len(cutoffs))
    d = max_diff(got, _exposure_reference(m, data, cutoffs))
    if not d <= 1e-5:
        raise Refused(f"streaming exposure differs from the pattern-based reference by {d:.3g}")
    figures["exposure"] = d
    return figures


ANALYSES = ("massive", "dormant", "inject", "backcopy", "ablate", "sweep", "losses")


def _interventions(m) -> tuple[str, ...]:
    """The key-0 knockout and the value ablation, less the knockout where the model's rows refuse it (differential
    attention's signed rows: the op refuses attention edits)."""
    from probe.analyses.interventions.base import AblationError, refuse_attention_edits

    try:
        refuse_attention_edits(m.probe_info, "key-0 knockout")
    except AblationError:
        return ("value",)
    return ("knockout", "value")


def _run_analysis(m, name: str, data) -> dict:
    from probe.analyses.ablate import ablate
    from probe.analyses.backcopy import backcopy_split
    from probe.analyses.capture import window_losses
    from probe.analyses.context_sweep import sink_context_sweep
    from probe.analyses.dormant import dormant_heads
    from probe.analyses.inject import inject
    from probe.analyses.massive import massive_activations

    run = {
        "massive": lambda: massive_activations(m, data),
        "dormant": lambda: dormant_heads(m, data),
        "inject": lambda: inject(m, data, junk=["structured"], doses=[0.0, 4.0], progress=False),
        "backcopy": lambda: backcopy_split(m, data, triggers=[5, 7]),
        "ablate": lambda: ablate(m, data, interventions=_interventions(m), value_modes=("zero",), per_layer=False),
        "sweep": lambda: sink_context_sweep(m, {6: data[..., :7], T: data})[0],
        "losses": lambda: {"windows": window_losses(m, data)},
    }
    return run[name]()


def _analyses(m) -> dict:
    """Every analysis that applies to an HF checkpoint, on one batch, the three with pattern-based references
    compared against them (a model's linear-attention layers take no part in the attention analyses)."""
    data = windows()
    figures = _reference_checks(m, data)
    for name in ANALYSES:
        for table_name, table in _run_analysis(m, name, data).items():
            numbers = table.select_dtypes("number").to_numpy(float) if table_name != "meta" else []
            if len(numbers) and not torch.isfinite(torch.tensor(numbers)).any():
                raise Refused(f"{name} gives no finite number in its {table_name} table")
    return figures


def _algebra(m64) -> dict:
    """The hook algebra (probe.checkpoints.algebra) in fp64 on the adapter: the rules that apply, each within
    ALGEBRA_TOL; a rule broken is returned as the reason the type is partial."""
    from probe.checkpoints import algebra

    with fp64_throughout():
        errors, _ = algebra.check(m64, ids())
    return errors


def _saved_folder(ref64) -> dict:
    """The fp64 logits of a folder saved and loaded through probe.load the way a user's is, against HF eager."""
    import tempfile

    from transformers import AutoModelForCausalLM

    import probe

    with tempfile.TemporaryDirectory() as folder:
        ref64.save_pretrained(folder)  # fp64 weights, as a user's fp64 save
        # HF's own load of the same folder: buffers made at construction (rotary frequencies, embedding scales) are
        # then made as a user's load makes them
        try:
            hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager")
        except ValueError as e:  # a text model of a multimodal family that no auto class loads from its own folder
            if "Unrecognized configuration class" in str(e):
                return {}
            raise
        hf.to(torch.float64)  # what transformers keeps in fp32 (a router's bias), as probe.load makes it fp64
        if hf._can_set_experts_implementation():
            hf.set_experts_implementation("eager")
        with _table_unchecked():  # the table being regenerated may refuse the type already
            loaded = probe.load(folder, dtype=torch.float64)
        x = ids()
        with torch.no_grad(), fp64_throughout():
            d = max_diff(loaded(x).logits, hf(x).logits)
    if not d <= TOL["fp64"]:
        raise Refused(f"a saved folder loaded in fp64 differs from HF eager by {d:.3g} > {TOL['fp64']:g}")
    return {"saved_fp64": d}


ALGEBRA_TOL = 1e-10


@contextlib.contextmanager
def _table_unchecked():
    """probe.load without the coverage table's refusal: the check decides the type's record."""
    from probe.checkpoints import load

    before, load.check_architecture = load.check_architecture, lambda *a, **k: None
    try:
        yield
    finally:
        load.check_architecture = before


def lacking(m) -> list[str]:
    """The standard hook points this adapter does not fire. A linear-attention (or state-space) layer's missing
    attention hooks are not lacking: it has no softmax attention to hook (its layer type says "linear")."""
    return [p for p in STANDARD_POINTS if p in m.probe_info.absent_hooks]


@contextlib.contextmanager
def layers_unverified():
    """Family adapters replace HF's layer forward whatever source the table recorded: while it is regenerated."""
    from probe.checkpoints import hooked_hf

    before, hooked_hf.VERIFY_LAYERS = hooked_hf.VERIFY_LAYERS, False
    try:
        yield
    finally:
        hooked_hf.VERIFY_LAYERS = before


def _verbs(ref) -> dict:
    """Every model verb of the CLI in process on ``ref`` saved with the tiny tokenizer (tests/support/verbs.py)."""
    import tempfile

    from tests.support import verbs

    with tempfile.TemporaryDirectory() as folder, _table_unchecked():
        ref.save_pretrained(folder)
        verbs.save_tokenizer(folder)
        return verbs.run_every_verb(Path(folder))


def check(model_type: str, run_verbs: bool = False) -> dict:
    """The coverage record of ``model_type`` (see the module docstring); ``run_verbs``: every CLI verb as well, as
    the regeneration does (a verb that fails makes the type partial, named ``verb NAME: why``)."""
    from probe.checkpoints.adapters import adapt
    from probe.checkpoints.hooked_hf import layer_source_hash

    start = time.perf_counter()
    record = {"model_type": model_type, "kind": kind_of(model_type)}
    if record["kind"] != "decoder-only":
        return {**record, "status": "refused", "reason": f"not decoder-only: an {record['kind']} model"}
    try:
        ref = _stage("tiny config", _hf_eager, model_type, torch.float32)
        m = _stage("adapter", adapt, copy.deepcopy(ref))
        record["adapter"] = m.family
        x = ids()
        figures, cache = _stage("fp32 parity", _logits, ref, m, x, "fp32")
        _stage("hook points", _every_hook_fires, m, cache)
        figures.update(_stage("pattern", _pattern_vs_output_attentions, ref, m, x, cache))
        figures.update(_stage("hook_v edit", _value_edit, ref, m, x))
        ref64 = copy.deepcopy(ref).to(torch.float64)
        m64 = _stage("adapter fp64", adapt, copy.deepcopy(ref64))
        figures.update(_stage("fp64 parity", _logits, ref64, m64, x, "fp64")[0])
        figures.update(_stage("saved folder", _saved_folder, ref64))
        algebra_errors = _stage("algebra", _algebra, m64)
        lacks = lacking(m)
        figures.update(_stage("analyses", _analyses, m))
        # verbs take a saved folder: none for a text model that HF cannot reload from its own folder (no saved_fp64)
        outcomes = _stage("verbs", _verbs, ref) if run_verbs and "saved_fp64" in figures else {}
    except Refused as e:
        return {**record, "status": "refused", "reason": str(e), "seconds": round(time.perf_counter() - start, 2)}
    info = m.probe_info
    if m.layer_body is not None:  # the HF layer source this family's replaced forward was shown equal to
        record["layer_hash"] = layer_source_hash(m.decoder_layers(m.hf_model)[0])
    from probe.checkpoints.algebra import failures
    from tests.support import verbs

    broken = failures(algebra_errors, ALGEBRA_TOL) + [f"verb {f}" for f in verbs.failures(outcomes)]
    record.update(
        status="partial" if lacks or broken else "supported",
        lacks=lacks,
        breaks=broken,
        algebra={k: (None if v is None else float(f"{v:.2g}")) for k, v in algebra_errors.items()},
        layer_types=sorted(set(info.layer_types)),
        phantom=info.has_phantom,
        parity={k: float(f"{v:.3g}") for k, v in figures.items()},
        **({"verbs": {v: o.split(":")[0] for v, o in outcomes.items()}} if outcomes else {}),
        seconds=round(time.perf_counter() - start, 2),
    )
    return record


def family_models(model_type: str, overrides: dict | None = None) -> tuple:
    """(HF eager fp32, its adapter, HF eager fp64, its adapter) on the tiny config of ``model_type`` with
    ``overrides``: what a per-family test file checks."""
    from probe.checkpoints.adapters import adapt
    from probe.checkpoints.tiny import tiny_model

    ref = tiny_model(model_type, overrides=overrides)
    ref64 = copy.deepcopy(ref).to(torch.float64)
    return ref, adapt(copy.deepcopy(ref)), ref64, adapt(copy.deepcopy(ref64))


def assert_parity(models: tuple) -> None:
    """The coverage table's parity checks on :func:`family_models`: logits (fast and every-hook paths) within TOL in
    fp32 and fp64, every hook point firing, hook_pattern equal to HF's weights and a hook_v edit to the same edit
    inside HF (each raises Refused past its tolerance)."""
    ref, m, ref64, m64 = models
    x = ids()
    _, cache = _logits(ref, m, x, "fp32")
    _logits(ref64, m64, x, "fp64")
    _every_hook_fires(m, cache)
    _pattern_vs_output_attentions(ref, m, x, cache)
    _value_edit(ref, m, x)


def causal_lm_types() -> list[str]:
    """Every causal-LM model_type of the installed transformers: what the coverage table lists."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def check_entry(model_type: str, table: dict) -> None:
    """The table's record of ``model_type`` still holds: the same status, the same missing hooks (the same refusal
    stage), and for a replaced layer forward the same HF layer source."""
    want = table["types"][model_type]
    got = check(model_type)
    assert got["status"] == want["status"], (
        f"{model_type} is {want['status']} in the coverage table but now {got['status']}: "
        f"{got.get('reason') or got.get('lacks')} (regenerate with -m slow if transformers changed)"
    )
    if want["status"] == "refused":
        assert got["reason"].split(":")[0] == want["reason"].split(":")[0], (got["reason"], want["reason"])
    else:
        assert got["lacks"] == want["lacks"] and got.get("layer_hash") == want.get("layer_hash")
        rules = [b for b in want.get("breaks", []) if not b.startswith("verb ")]  # verbs: tests/cli/test_verbs_*
        assert got.get("breaks", []) == rules, (model_type, got.get("breaks"), want.get("breaks"))


def generate(table_file, docs_page, only: tuple[str, ...] = ()) -> dict:
    """Run every check and write the coverage table and its docs page (the ``-m slow`` regeneration); ``only``: re-check
    those types and keep the table's other records (an adapter's change, under the transformers the table was made
    with)."""
    import json

    import transformers

    from probe.checkpoints import architectures
    from probe.writes import atomic_write

    kept = json.loads(Path(table_file).read_text()) if only else {"types": {}}
    if only and kept["transformers"] != transformers.__version__:
        raise ValueError(f"the table is of transformers {kept['transformers']}: regenerate every type, not {only}")
    with layers_unverified():
        checked = {mt: check(mt, run_verbs=True) for mt in (only or causal_lm_types())}
    for r in checked.values():
        r.pop("model_type", None)
        r.pop("seconds", None)
    types = {**kept["types"], **checked}
    data = {
        "transformers": transformers.__version__,
        "command": "python -m pytest -m slow tests/checkpoints/test_architectures.py",
        "tolerances": TOL,
        "counts": architectures.counts(types),
        "types": types,
    }
    atomic_write(table_file, json.dumps(data, indent=1, sort_keys=True) + "\n")
    atomic_write(docs_page, architectures.markdown(data))
    return data
