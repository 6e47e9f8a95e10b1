"""The token ids a forward takes, checked as the CLI checks its flags: one place for probe's models and the HF adapters
(``TransformerLensCalls.input_tokens`` calls :func:`check_token_ids` for ``forward``, ``model(...)``,
``run_with_cache`` and ``run_with_hooks`` alike), so the Python API answers a bad input with one line naming the value
and what is valid, never a raw torch error or a silent answer past the model's context.

Valid: an integer tensor (``torch.long`` or ``torch.int32``: what an embedding takes) of shape (B,T) (a 1-D tensor
is one sequence) with B >= 1, 1 <= T <= the model's maximum context and every id in 0..V-1. The error is an
:class:`InputError`: a ``ValueError`` (what Python code catches) and a :class:`probe.errors.UsageError` (one line on
stderr, exit 2, where the CLI reaches it).

The maximum context (``context_limit`` of the model) is probe's ``n_ctx`` and an HF config's
``max_position_embeddings`` (HF's own forward runs rotary models past it without a word). Rotary models whose config
scales their frequencies for longer sequences as they come (``rope_type`` "dynamic": HF recomputes the NTK-scaled
frequencies for any length past ``max_position_embeddings``) have no maximum: HF runs them at any length by design.
YaRN, LongRoPE and Llama 3 scalings do not: their ``max_position_embeddings`` is already the extended context. A
config that declares no maximum (state-space and recurrent models) has none.

:func:`past_context` lifts the limit for the code inside it: a stream run past the model's training length on
purpose (StreamingLLM's perplexity, ``--past-context``), where the caller has checked that the model's positions run
on (a stored table or learned positions still refuse, in the model).

Cost: Python checks of shape and dtype, and one ``aminmax`` over the ids read back together (one device sync on a
GPU, which the forward's first kernel would wait for anyway).
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

from probe.errors import UsageError

# what an embedding lookup takes (F.embedding refuses every other dtype)
ID_DTYPES = (torch.long, torch.int32)

_PAST_CONTEXT = contextvars.ContextVar("probe_past_context", default=False)


class InputError(UsageError, ValueError):
    """A forward's input the model cannot take: one line naming the value and what is valid."""


@contextlib.contextmanager
def past_context():
    """Forwards inside run past the model's maximum context (module docstring); nested uses are fine."""
    token = _PAST_CONTEXT.set(True)
    try:
        yield
    finally:
        _PAST_CONTEXT.reset(token)


def check_token_ids(ids, vocab_size: int, n_ctx: int | None, name: str = "the model", cached: int = 0) -> torch.Tensor:
    """``ids`` (a B,T integer tensor) if a model of ``vocab_size`` tokens and maximum context ``n_ctx`` (None: no
    maximum) can take it after ``cached`` positions already in its KV cache; else an :class:`InputError` of one line.
    """
    model = name if name == "the model" else f"model {name!r}"
    if not isinstance(ids, torch.Tensor):
        raise InputError(
            f"token ids of type {type(ids).__name__}: pass a string, a list of strings or an integer tensor of "
            f"token ids 0..{vocab_size - 1} of shape (B,T) or (T,)"
        )
    shape = tuple(ids.shape)
    if ids.dtype not in ID_DTYPES:
        raise InputError(
            f"token ids of dtype {ids.dtype} (shape {shape}): pass integer ids 0..{vocab_size - 1} as torch.long "
            "(or torch.int32)"
        )
    if ids.ndim != 2:
        raise InputError(f"token ids of shape {shape}: pass (B,T) (a batch of sequences) or (T,) (one sequence)")
    B, T = shape
    if B == 0:
        raise InputError(f"token ids of shape {shape}: the batch is empty; pass at least one sequence (B >= 1)")
    limit = None if n_ctx is None or _PAST_CONTEXT.get() else n_ctx - cached
    if T == 0:
        span = f"1..{limit}" if limit is not None and limit >= 1 else "at least 1"
        raise InputError(f"token ids of shape {shape}: no tokens; pass {span} tokens per sequence (T)")
    if limit is not None and T > limit:
        after = f" after {cached} cached positions" if cached else ""
        raise InputError(
            f"sequence length T={T}{after} exceeds the maximum context {n_ctx} of {model}; pass T 1..{max(limit, 0)} "
            "(split longer inputs into windows)"
        )
    low, high = torch.aminmax(ids)
    low, high = torch.stack((low, high)).tolist()  # one read back
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InputError(f"token id {bad} is outside the vocabulary of {model}: ids are 0..{vocab_size - 1}")
    return ids


def rope_types(config) -> set[str]:
    """The ``rope_type`` values of an HF config (``rope_parameters``, one dict or one per layer type; the older
    ``rope_scaling``), "default" when it declares none."""
    out = set()
    for params in (getattr(config, "rope_parameters", None), getattr(config, "rope_scaling", None)):
        if not isinstance(params, dict):
            continue
        nested = [p for p in params.values() if isinstance(p, dict)]
        for p in nested or [params]:
            kind = p.get("rope_type", p.get("type"))
            if kind:
                out.add(str(kind))
    return out or {"default"}


def hf_context_limit(config) -> int | None:
    """The maximum context of an HF config (module docstring): ``max_position_embeddings`` of its text config, None
    where it declares none or scales its rotary frequencies dynamically."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_ctx = getattr(text, "max_position_embeddings", None)
    if not isinstance(n_ctx, int) or n_ctx <= 0 or "dynamic" in rope_types(text):
        return None
    return n_ctx


__all__ = ["ID_DTYPES", "InputError", "check_token_ids", "hf_context_limit", "past_context", "rope_types"]
