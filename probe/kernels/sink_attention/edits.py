"""Attention edits the op itself carries out for one call: key-0 knockout and window eviction
(docs/definitions.md#ablations).

An analysis arms an edit from a hook that fires just before a layer's attention op (``hook_v_out``: the last
attention hook before the op, on probe's models and on the HF adapters alike); the next ``probe.kernels.sink_attention``
call takes it, so the edit is made by the op's own per-key bias and kept-first-keys rule, on whichever backend
runs, and nothing T x T is built for it:

    knockout   key 0 leaves every row's softmax (key_bias_0 = -inf for the chosen KV heads): rows renormalise over the
               other keys and the phantom. Query 0 of a head without a phantom would see nothing; it keeps its clean
               row (a 1 x 1 call of the op on key 0 alone).
    eviction   query t sees keys 0 .. keep-1 and t-window+1 .. t at their original positions (StreamingLLM's window
               with its first keys kept; no re-indexing of positions). The layer's own sliding window still applies:
               the tighter of the two wins, and kept keys outside the layer's own window stay unseen.

``armed()`` is the scope: it refuses to end with an edit left untaken (an op that never ran through
sink_attention, e.g. a materialised pattern, would otherwise pass the edit on to the next layer).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionEdit:
    knockout: bool = False  # remove key 0 from every query's softmax but query 0's own (when it has no phantom)
    kv_heads: tuple[int, ...] | None = None  # KV heads the knockout touches (None: all)
    keep: int | None = None  # eviction: the first keys kept visible
    window: int | None = None  # eviction: the recent-key window w (query t sees t-w+1 .. t)

    def __post_init__(self):
        if (self.keep is None) != (self.window is None):
            raise ValueError("window eviction takes both keep and window")
        if self.window is not None and (int(self.window) != self.window or self.window < 1):
            raise ValueError(f"eviction window must be a positive int, got {self.window!r}")
        if self.keep is not None and (int(self.keep) != self.keep or self.keep < 0):
            raise ValueError(f"kept first keys must be an int >= 0, got {self.keep!r}")


_state = threading.local()


def arm(edit: AttentionEdit) -> None:
    """The next sink_attention call on this thread carries out ``edit`` (inside ``armed()``)."""
    if getattr(_state, "depth", 0) == 0:
        raise RuntimeError("arm() outside probe.kernels.sink_attention.edits.armed()")
    if getattr(_state, "edit", None) is not None:
        raise RuntimeError("an attention edit was armed twice before an attention op took it")
    _state.edit = edit


def take() -> AttentionEdit | None:
    """The armed edit, removed (None when nothing is armed)."""
    edit = getattr(_state, "edit", None)
    _state.edit = None
    return edit


@contextlib.contextmanager
def armed():
    """Scope of armed edits; raises if one is left that no attention op took."""
    _state.depth = getattr(_state, "depth", 0) + 1
    _state.edit = None
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        _state.depth -= 1
        left = take()
        if left is not None and not failed:
            raise RuntimeError(
                f"an attention edit ({left}) was armed but no probe.kernels.sink_attention call took "
                "it (a pattern materialised outside the op?)"
            )


def knockout_bias(key_bias: torch.Tensor | None, B: int, Hkv: int, Tk: int, kv_heads, device) -> torch.Tensor:
    """key_bias (B,Hkv,Tk) fp32 with -inf on key 0 of the chosen KV heads (a copy; the caller's is not changed)."""
    bias = torch.zeros(B, Hkv, Tk, device=device) if key_bias is None else key_bias.float().clone()
    heads = list(range(Hkv)) if kv_heads is None else list(kv_heads)
    bias[:, heads, 0] = float("-inf")
    return bias


def empty_first_rows(sink: torch.Tensor | None, H: int, Hkv: int, kv_heads, device) -> torch.Tensor:
    """(H,) bool: query heads whose query 0 sees nothing after the knockout (knocked out and no phantom)."""
    G = H // Hkv
    knocked = torch.zeros(Hkv, dtype=torch.bool, device=device)
    knocked[list(range(Hkv)) if kv_heads is None else list(kv_heads)] = True
    knocked = knocked.repeat_interleave(G)
    no_phantom = torch.ones(H, dtype=torch.bool, device=device) if sink is None else torch.isneginf(sink.float())
    return knocked & no_phantom


def eviction_rule(window: int | None, edit: AttentionEdit, T: int):
    """(window, keep, extra_mask) for the op: the eviction window and kept keys combined with the layer's own sliding
    ``window``. extra_mask (T,T) bool of visible keys is needed only when the layer's window is wider than the
    eviction's yet narrower than the sequence (kept keys must stay inside it); else None."""
    w, k = int(edit.window), int(edit.keep)
    if k + w >= T:  # every query still sees every earlier key: the layer's own op, unchanged
        return window, None, None
    if window is not None and window <= w:
        return window, None, None  # the layer's own window is the tighter: eviction changes nothing
    if window is not None and window < T:
        from probe.kernels.sink_attention.reference import visible_mask

        both = visible_mask(T, w, keep=k) & visible_mask(T, window)
        return None, None, both
    return w, k, None
