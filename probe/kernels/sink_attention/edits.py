"""Attention edits the op itself carries out for one call: key-0 knockout and window eviction
(docs/definitions.md#ablations, docs/definitions.md#window-eviction).

An analysis arms an edit from a hook that fires just before a layer's attention op (``hook_v_out``: the last
attention hook before the op, on probe's models and on the HF adapters alike); the next ``probe.kernels.sink_attention``
call takes it, so the edit is made by the op itself, on whichever backend runs, over the whole sequence in that one
call (the op's windowed paths work in query blocks of their own), and nothing T x T is built for it:

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
``armed()`` is the scope: it refuses to end with an edit left untaken (an op that never ran through sink_attention,
e.g. a materialised pattern, would otherwise pass the edit on to the next layer).
"""

from __future__ import annotations

import contextlib
import threading
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


_state = threading.local()


def arm(edit: AttentionEdit) -> None:
    """The next sink_attention call on this thread carries out ``edit`` (inside ``armed()``)."""
    if getattr(_state, "depth", 0) == 0:
        raise RuntimeError("arm() outside probe.kernels.sink_attention.edits.armed()")
    if getattr(_state, "edit", None) is not None:
        raise RuntimeError("an attention edit was armed twice before an attention op took it")
    _state.edit = edit


def pending() -> bool:
    """Is an edit armed and not yet taken?"""
    return getattr(_state, "edit", None) is not None


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
