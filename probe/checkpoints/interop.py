"""``wrap(obj)``: bring your own TransformerLens ``TransformerBridge``, nnsight model or HF model.

The result is a probe-protocol model (``probe_info``, ``tokenizer``, ``run_with_cache``/``run_with_hooks`` with probe's
hook names, docs/definitions.md#hook-namespace). The object handed in is not modified: the adapter hooks a structural
copy of the underlying HF model that shares its parameters (no extra weight memory; weight edits are seen by both), so
the bridge / nnsight wrapper keeps working unchanged. Probe models (custom or already adapted) are returned as they are.
"""

from __future__ import annotations

from pathlib import Path


def _underlying(obj):
    """(hf_model, tokenizer) inside a TransformerBridge, an nnsight Envoy/LanguageModel or an HF model."""
    mod = type(obj).__module__ or ""
    if mod.startswith("transformer_lens"):
        from transformer_lens.model_bridge import TransformerBridge

        if isinstance(obj, TransformerBridge):
            if getattr(obj, "_weights_processed", False):
                raise ValueError(
                    "this TransformerBridge has processed (folded/centred) weights, which no longer "
                    "compute the HF forward; wrap it before process_weights()/enable_compatibility_mode()"
                )
            return obj.original_model, getattr(obj, "tokenizer", None)
    if mod.startswith("nnsight"):
        inner = obj.__dict__.get("_module")
        if inner is not None:
            return inner, obj.__dict__.get("tokenizer") or getattr(obj, "tokenizer", None)
    from transformers import PreTrainedModel

    if isinstance(obj, PreTrainedModel):
        return obj, None
    raise TypeError(
        f"cannot wrap a {type(obj).__qualname__}: pass a TransformerBridge, an nnsight model, a "
        f"transformers causal LM, a probe model, or a name/path for probe.load"
    )


def wrap(obj, tokenizer=None, name: str | None = None):
    """A probe-protocol view of ``obj`` (see module docstring); strings and paths go to :func:`probe.load`."""
    from probe.checkpoints.hooked_hf import is_hooked, shared_clone

    if is_hooked(obj):
        return obj
    if isinstance(obj, (str, Path)):
        from probe.checkpoints.load import load

        return load(obj)
    hf, tok = _underlying(obj)
    if hasattr(hf, "probe_info"):  # a custom probe model inside a wrapper: already speaks the protocol
        return hf
    from probe.checkpoints.adapters import adapt

    model = adapt(shared_clone(hf), tokenizer=tokenizer if tokenizer is not None else tok, name=name)
    model.probe_info.extra["wrapped"] = type(obj).__qualname__
    return model
