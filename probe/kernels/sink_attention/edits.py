"""Attention edits the op itself carries out for one call: key-0 knockout and window eviction
(docs/definitions.md#ablations, docs/definitions.md#window-eviction).

An edit is an argument of the op: ``sink_attention(..., edit=AttentionEdit(...))``. An analysis hands one to a layer
from a hook on the layer's ``hook_v_out`` (the last attention hook before the op, on probe's models and on the HF
adapters alike) with :func:`carry`, which leaves it on that HookPoint; the attention function that fired the point
takes it back at once (:func:`taken`) and passes it to its op call. The edit is made by the op itself, on whichever
backend runs, over the whole sequence in that one call (the op's windowed paths work in query blocks of their own),
and nothing T x T is built for it:

    knockout   key 0 leaves every row's softmax: rows renormalise over the other keys and the phantom. For every KV
               head the op runs on queries and keys 1 .. T-1 (the same rule, one key fewer); for chosen KV heads
               key_bias_0 = -inf. Query 0 of a head without a phantom would see nothing; it keeps its clean row (a
               1 x 1 call of the op on key 0 alone).
    eviction   query t sees keys 0 .. keep-1 and t-window+1 .. t (StreamingLLM's window with its first keys kept).
               positions "original": every key at its position in the text (the op's kept-first-keys rule);
               "cache": positions within the cache as StreamingLLM assigns them — window keys keep their distance
               to the query, kept key i sits at distance min(t, keep+window-1) - i, scored with the query re-rotated
               by the layer's own rotary (``rotary``: its cos/sin at positions 0 .. T-1) and merged with the window
               by lse (kept.py). The layer's own sliding window still applies, counting the distance the layer's
               rotary sees (in the text, or in the cache): the tighter of the two wins.

An edit that cannot be carried (a cache, key padding, fewer queries than keys) is an error, never a silent no-op.
``carried(model)`` is the scope of such a forward: it refuses to end with an edit left on a hook point (an attention
function that never passed it to sink_attention), and removes it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

POSITIONS = ("original", "cache")  # where evicted attention puts its keys (docs/definitions.md#window-eviction)


@dataclass(frozen=True, eq=False)
class AttentionEdit:
    knockout: bool = False  # remove key 0 from every query's softmax but query 0's own (when it has no phantom)
    kv_heads: tuple[int, ...] | None = None  # KV heads the knockout touches (None: all)
    keep: int | None = None  # eviction: the first keys kept visible
    window: int | None = None  # eviction: the recent-key window w (query t sees t-w+1 .. t)
    positions: str = "original"  # eviction: keys at their positions in the text, or within the cache
    rotary: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)  # cache: (cos, sin) (T, d_rot/2)

    def __post_init__(self):
        if self.positions not in POSITIONS:
            raise ValueError(f"eviction positions must be one of {', '.join(POSITIONS)}, got {self.positions!r}")
        if self.positions == "cache" and (self.keep is None or self.rotary is None):
            raise ValueError("eviction at cache positions takes keep, window and the layer's rotary (cos, sin)")
        if (self.keep is None) != (self.window is None):
            raise ValueError("window eviction takes both keep and window")
        if self.window is not None and (int(self.window) != self.window or self.window < 1):
            raise ValueError(f"eviction window must be a positive int, got {self.window!r}")
        if self.keep is not None and (int(self.keep) != self.keep or self.keep < 0):
            raise ValueError(f"kept first keys must be an int >= 0, got {self.keep!r}")


EDIT_KEY = "attention_edit"  # where a hook puts the edit on the layer's hook_v_out HookPoint


def carry(hook, edit: AttentionEdit) -> None:
    """Hand ``edit`` to the attention op of the layer whose ``hook_v_out`` is ``hook``: called from a hook on that
    point; the attention function that fired it takes the edit back (:func:`taken`) and passes it to the op."""
    if hook.__dict__.get(EDIT_KEY) is not None:
        raise RuntimeError("an attention edit was handed to the same layer twice before its attention op took it")
    hook.__dict__[EDIT_KEY] = edit


def taken(hook) -> AttentionEdit | None:
    """The edit a hook left on ``hook`` (a layer's hook_v_out, just fired), removed; None when there is none."""
    return None if hook is None else hook.__dict__.pop(EDIT_KEY, None)


@contextlib.contextmanager
def carried(model):
    """Scope of a forward whose hooks carry edits: raises if one is left on a hook point that no attention op took
    (an op that never ran through sink_attention, e.g. a materialised pattern), and removes it."""
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        left = [m.__dict__.pop(EDIT_KEY) for m in model.modules() if m.__dict__.get(EDIT_KEY) is not None]
        if left and not failed:
            raise RuntimeError(
                f"an attention edit ({left[0]}) was handed to a layer but no probe.kernels.sink_attention call took "
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


class EvictionPlan(NamedTuple):
    """How the op carries out an eviction: ``own`` (the layer's attention unchanged), ``rule`` (one call of the
    kept-first-keys rule: window, keep) or ``merge`` (the window's attention, then the kept first keys as a second
    attention merged by lse, kept.py: kept keys seen only within ``reach`` of the query's position, None: always;
    positions within the cache when ``cache``)."""

    kind: str
    window: int | None
    keep: int | None = None
    reach: int | None = None
    cache: bool = False


def eviction_plan(window: int | None, edit: AttentionEdit, T: int) -> EvictionPlan:
    """The plan for an eviction on a layer whose own sliding window is ``window`` (None: a full layer), T keys."""
    w, k = int(edit.window), int(edit.keep)
    own = None if window is None or window >= T else int(window)
    if k + w >= T or (own is not None and own <= w):  # no query outgrows the cache, or the layer's window is tighter
        return EvictionPlan("own", window)
    if own is None and edit.positions == "original":
        return EvictionPlan("rule", w, k)
    return EvictionPlan("merge", w, k, own, edit.positions == "cache")
