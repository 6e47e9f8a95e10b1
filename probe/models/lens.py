"""TransformerLens's calling conventions on probe's models and on the HF adapters (``ProbeForCausalLM``,
``probe.checkpoints.hooked_hf.HookedHF``): one mixin, :class:`TransformerLensCalls`.

As in TransformerLens (``HookedTransformer``, ``TransformerBridge``):

* ``run_with_cache(input)`` returns ``(logits, cache)`` and ``run_with_hooks(input, fwd_hooks=...)`` the logits, a
  B,T,V tensor; ``return_type=`` ``"logits"`` (default), ``"loss"`` (mean next-token cross-entropy over the B x (T-1)
  predicted positions), ``"both"`` (``(logits, loss)``) or ``None`` (nothing: the LM head is not run); with
  ``loss_per_token=True`` the loss is B,T-1 (position t's loss of predicting token t+1).
* ``model(input, return_type=...)`` is the same call; ``model(ids)`` without ``return_type`` stays the HF forward (an
  HF output with ``.logits``), so ``generate()``, nnsight and ``probe.checkpoints.wrap`` see an HF model.
* ``input``: token ids (B,T; a 1-D tensor is one sequence), a string or a list of strings. Text becomes tokens by
  :meth:`to_tokens`, whose ``prepend_bos`` follows probe's BOS rule when not given (docs/definitions.md#bos-rule:
  TransformerLens's default, True for most architectures, prepends one that Pythia and GPT-2 never saw in training).
  Token ids are checked first, for every entry point (``probe.models.inputs``): a float, bool or 3-D tensor, an empty
  batch, no tokens, T past the model's maximum context or an id outside the vocabulary is one line naming the value
  and what is valid (an ``InputError``: a ``ValueError`` and probe's ``UsageError``).

The cache is a :class:`probe.models.cache.ActivationCache`: a dict of hook name -> tensor that is TransformerLens's
``ActivationCache`` (``decompose_resid``, ``accumulated_resid``, ``apply_ln_to_stack``, ``stack_head_results``,
``logit_attrs``, ``logit_lens``) through the protocol cache.py describes; ``return_cache_object=False`` gives the
plain dict, as TransformerLens does.

The class using the mixin provides ``forward(input_ids, attention_mask=None, return_hidden=False, **kw)`` (the HF
forward), ``tokenizer``, ``probe_info`` and, where ids go elsewhere than ``device``, ``input_device``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from transformer_lens.HookedRootModule import HookedRootModule
from transformer_lens.utilities.slice import Slice

from probe.hooks import names
from probe.models.cache import ActivationCache
from probe.models.inputs import check_token_ids

RETURN_TYPES = ("logits", "loss", "both", None)


class HookNameError(KeyError, ValueError):
    """A hook name the model has no point for (TransformerLens's bare KeyError), in one line with the nearest names."""

    def __init__(self, model, name: str, why: str | None = None):
        import difflib

        if why is not None:  # a point the model has but never fires: a hook there would never run
            super().__init__(f"model {model.probe_info.name!r} never fires {name!r}: {why}")
            return
        close = difflib.get_close_matches(name, list(model.hook_dict), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; the model's points are the keys of its hook dict"
        super().__init__(f"no hook point {name!r} in model {model.probe_info.name!r}{hint}")

    def __str__(self) -> str:  # a KeyError's str() is its argument's repr
        return str(self.args[0])


# TransformerLens forward options that probe's models do not implement: refused, never silently ignored
NOT_SUPPORTED = ("start_at_layer", "stop_at_layer", "past_kv_cache", "tokens", "shortformer_pos_embed")


def refuse_lens_options(kwargs: dict) -> None:
    """A TypeError in one line for the first TransformerLens option among ``kwargs`` that probe's models lack."""
    refused = [k for k in NOT_SUPPORTED if k in kwargs]
    if refused:
        raise TypeError(f"{refused[0]}= is a TransformerLens HookedTransformer option that probe's models lack")


class _HFOutput:
    """The default ``return_type`` of ``forward``: the HF output (a TransformerLens ``return_type`` is a string or
    None, so neither can mean "not given")."""

    def __repr__(self) -> str:
        return "HF_OUTPUT"


HF_OUTPUT = _HFOutput()


@functools.cache
def _default_tokenizer():
    """The shipped tokenizer of probe's text models, for a custom model created without one (as its windows use)."""
    from probe.data.tokenizer import DEFAULT_TOKENIZER, load_tokenizer

    return load_tokenizer(DEFAULT_TOKENIZER)


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor, mask=None, per_token: bool = False) -> torch.Tensor:
    """TransformerLens's ``lm_cross_entropy_loss``: -log p(token t+1 | ..t) at positions 0..T-2, B,T-1 with
    ``per_token``, else their mean; with a B,T ``mask`` (0: padding) a position counts when it and its next token are
    real (zero loss per token otherwise). Computed in fp32 whatever the logits' dtype."""
    tokens = tokens.to(logits.device)
    losses = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten(), reduction="none").view_as(
        tokens[:, 1:]
    )
    if mask is None:
        return losses if per_token else losses.mean()
    mask = mask.to(logits.device).bool()
    keep = mask[:, :-1] & mask[:, 1:]
    losses = losses.masked_fill(~keep, 0.0)
    return losses if per_token else losses.sum() / keep.sum()


class TransformerLensCalls:
    """``run_with_cache`` / ``run_with_hooks`` / ``forward(return_type=...)`` and ``to_tokens`` / ``to_string`` /
    ``to_str_tokens`` / ``to_single_token`` with TransformerLens's return values (module docstring), for a class that
    is also a TransformerLens ``HookedRootModule``."""

    if TYPE_CHECKING:  # what the class using the mixin provides
        probe_info: Any
        tokenizer: Any
        device: torch.device
        hook_dict: dict

        def forward(self, *args, **kwargs) -> Any: ...

    # ---- running ----------------------------------------------------------------------------------------
    def run_with_cache(self, *model_args, return_cache_object: bool = True, **kwargs):
        """TransformerLens's: ``(output, cache)``, the output as ``return_type`` says (default the logits tensor),
        the cache an :class:`~probe.models.cache.ActivationCache` (a dict of hook name -> tensor with
        TransformerLens's methods), or with ``return_cache_object=False`` a plain dict."""
        # positions are sliced here, on each point's own position axis (names.position_dim): TransformerLens's
        # caching hooks take the axis from the name's ending, which misreads B,T,H,dh points and B,H,Tq statistics
        pos_slice = kwargs.pop("pos_slice", None)
        wanted = kwargs.get("names_filter")
        for name in [wanted] if isinstance(wanted, str) else wanted if isinstance(wanted, list) else ():
            if isinstance(name, str) and name not in self.hook_dict:  # a misspelt name: never an empty cache
                raise HookNameError(self, name)
        self.__dict__["_caching"] = True  # its caching hooks name every point: hooks() checks a caller's names only
        try:
            output, cache = HookedRootModule.run_with_cache(self, *model_args, **_lens_kwargs(kwargs))
        finally:
            self.__dict__["_caching"] = False
        if pos_slice is not None:
            positions, drop = Slice(pos_slice), 1 if kwargs.get("remove_batch_dim", False) else 0
            for name, tensor in cache.items():
                if (dim := names.position_dim(name)) is not None:
                    cache[name] = positions.apply(tensor, dim=dim - drop)
        if not return_cache_object:
            return output, cache
        return output, ActivationCache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    def run_with_hooks(self, *model_args, **kwargs):
        """TransformerLens's: the output as ``return_type`` says (default the logits tensor) of a forward with
        ``fwd_hooks`` / ``bwd_hooks`` added for the call."""
        self.check_hook_names([*kwargs.get("fwd_hooks", ()), *kwargs.get("bwd_hooks", ())])
        return HookedRootModule.run_with_hooks(self, *model_args, **_lens_kwargs(kwargs))

    def hooks(self, fwd_hooks=(), bwd_hooks=(), reset_hooks_end: bool = True, clear_contexts: bool = False):
        """TransformerLens's context manager, with the names checked as ``run_with_hooks`` checks them."""
        if not self.__dict__.get("_caching"):
            self.check_hook_names([*fwd_hooks, *bwd_hooks])
        return HookedRootModule.hooks(self, list(fwd_hooks), list(bwd_hooks), reset_hooks_end, clear_contexts)

    def add_hook(self, name, hook, dir="fwd", is_permanent=False, level=None, prepend=False) -> None:
        """TransformerLens's, with a hook name checked as ``run_with_hooks`` checks it (a filter function is not)."""
        self.check_hook_names([(name, hook)])
        HookedRootModule.add_hook(self, name, hook, dir=dir, is_permanent=is_permanent, level=level, prepend=prepend)

    def check_hook_names(self, hooks) -> None:
        """Refuse, in one line, a (name, hook) whose name is no hook point of the model or a point it never fires (a
        hook there would silently never run); names given as filter functions are not checked."""
        for name, _ in hooks:
            if not isinstance(name, str):
                continue
            if name not in self.hook_dict:
                raise HookNameError(self, name)
            if (why := self.probe_info.lacks(name)) is not None:
                raise HookNameError(self, name, why)
            if name in self.unfired_points():
                raise HookNameError(self, name, "no mechanism of this model writes it (e.g. a gate or sink it lacks)")

    def unfired_points(self) -> frozenset[str]:
        """Hook points the model has but never fires beyond what ``probe_info.lacks`` knows (probe's models)."""
        return frozenset()

    def lens_forward(
        self,
        input,
        return_type="logits",
        *,
        loss_per_token: bool = False,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs,
    ):
        """The forward under TransformerLens's ``return_type`` (called by ``forward`` when one is given)."""
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type {return_type!r}: choose 'logits', 'loss', 'both' or None")
        refuse_lens_options(kwargs)
        if kwargs.pop("return_hidden", False):
            raise TypeError("return_hidden and return_type are exclusive: return_hidden gives the final hidden states")
        tokens, padding = self.input_tokens(input, prepend_bos, padding_side)
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if return_type is None:  # as TransformerLens: the blocks and the final norm run (and their hooks), no head
            self.forward(tokens, return_hidden=True, **kwargs)
            return None
        logits = self.forward(tokens, **kwargs).logits
        if return_type == "logits":
            return logits
        mask = attention_mask if attention_mask is not None else padding
        loss = next_token_loss(logits, tokens, mask, per_token=loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    # ---- text -------------------------------------------------------------------------------------------
    def input_tokens(
        self, input, prepend_bos=None, padding_side=None, cached: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B,T token ids on the model's input device, the padding mask of a list of texts of unequal lengths or
        None): a string or list of strings through :meth:`to_tokens`, a 1-D tensor as one sequence. Token ids are
        checked (:func:`probe.models.inputs.check_token_ids`: an integer B,T tensor, B and T >= 1, T at most the
        model's context less the ``cached`` positions of a KV cache, ids in the vocabulary): one line otherwise."""
        if isinstance(input, str) or (isinstance(input, (list, tuple)) and input and isinstance(input[0], str)):
            tokens, mask = self._encode(input, prepend_bos, padding_side, truncate=True)
            return tokens.to(self._token_device()), mask
        if isinstance(input, torch.Tensor) and input.ndim == 1 and not input.is_floating_point():
            input = input.unsqueeze(0)
        vocab_size, n_ctx, name = self.input_limits()
        input = check_token_ids(input, vocab_size, n_ctx, name, cached)
        return input.to(self._token_device()), None

    def input_limits(self) -> tuple[int, int | None, str]:
        """(vocabulary size, maximum context or None, name): what token ids are checked against
        (:func:`probe.models.inputs.check_token_ids`); here the ModelInfo's."""
        info = self.probe_info
        return info.vocab_size, info.n_ctx, info.name

    def to_tokens(
        self,
        input,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        move_to_device: bool = True,
        truncate: bool = True,
    ) -> torch.Tensor:
        """Text -> B,T token ids, as TransformerLens's ``to_tokens``: one row per string, shorter rows padded on
        ``padding_side`` (default the tokenizer's) with its pad id (its EOS without one), at most the model's context
        with ``truncate``. ``prepend_bos`` None follows probe's BOS rule (docs/definitions.md#bos-rule); True / False
        force it, as ``--bos`` / ``--no-bos`` do."""
        tokens, _ = self._encode(input, prepend_bos, padding_side, truncate)
        return tokens.to(self._token_device()) if move_to_device else tokens

    def to_string(self, tokens):
        """Token ids -> text: a 2-D input gives one string per row, 1-D or a scalar one string."""
        tokens = torch.as_tensor(tokens)
        if tokens.ndim > 2:
            raise ValueError(f"to_string takes 1-D or 2-D token ids, got shape {tuple(tokens.shape)}")
        tok = self._text_tokenizer()
        if tokens.ndim == 2:
            return tok.batch_decode(tokens.tolist(), clean_up_tokenization_spaces=False)
        return tok.decode(tokens.reshape(-1).tolist(), clean_up_tokenization_spaces=False)

    def to_str_tokens(self, input, prepend_bos: bool | None = None, padding_side: str | None = None):
        """Each token as its text: a string (tokenized by :meth:`to_tokens`) or 1-D ids give a list of strings, a
        list of them a list of lists."""
        if isinstance(input, list):
            return [self.to_str_tokens(x, prepend_bos, padding_side) for x in input]
        if isinstance(input, str):
            ids = self.to_tokens(input, prepend_bos, padding_side, move_to_device=False)[0]
        else:
            ids = torch.as_tensor(input)
            if ids.dim() > 1 and ids.shape[:-1].numel() > 1:  # TransformerLens refuses a batch too
                raise ValueError(
                    f"to_str_tokens takes one sequence, got token ids of shape {tuple(ids.shape)}; pass one row "
                    "(or a list of them)"
                )
            ids = ids.reshape(-1)
        return self._text_tokenizer().batch_decode([[int(t)] for t in ids.tolist()], clean_up_tokenization_spaces=False)

    def to_single_token(self, string: str) -> int:
        """The id of a string that is one token (no BOS)."""
        ids = self.to_tokens(string, prepend_bos=False, move_to_device=False).reshape(-1)
        if ids.numel() != 1:
            raise ValueError(f"{string!r} is {ids.numel()} tokens, not one")
        return int(ids[0])

    # ---- helpers ----------------------------------------------------------------------------------------
    def _text_tokenizer(self):
        tok = getattr(self, "tokenizer", None)
        if tok is not None:
            return tok
        if getattr(self.probe_info, "family", None) == "probe":
            return _default_tokenizer()
        raise ValueError("text input needs a tokenizer; pass token ids instead")

    def _token_device(self) -> torch.device:
        return getattr(self, "input_device", None) or self.device

    def _encode(self, input, prepend_bos, padding_side, truncate) -> tuple[torch.Tensor, torch.Tensor | None]:
        from probe.data.windows import window_bos_id

        texts = [input] if isinstance(input, str) else list(input)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("text input is a string or a non-empty list of strings")
        tok = self._text_tokenizer()
        bos = window_bos_id(self, tok, prepend_bos)  # None: no BOS; prepend_bos None decides by the BOS rule
        rows = [([] if bos is None else [bos]) + tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        if truncate:
            rows = [r[: self.probe_info.n_ctx] for r in rows]
        info = self.probe_info
        too_big = max((max(r) for r in rows if r), default=-1)
        if too_big >= info.vocab_size:
            raise ValueError(f"the tokenizer gives id {too_big}, past the model's vocabulary of {info.vocab_size}")
        T = max(len(r) for r in rows)
        if T == 0:
            raise ValueError("the text encodes to no tokens")
        if all(len(r) == T for r in rows):
            return torch.tensor(rows, dtype=torch.long), None
        side = padding_side or getattr(tok, "padding_side", None) or "right"
        if side != "right":
            raise ValueError(
                f"padding_side {side!r}: texts of unequal lengths are padded on the right (probe's models take no "
                "left padding); run them one at a time otherwise"
            )
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
        return torch.tensor([r + [pad] * (T - len(r)) for r in rows], dtype=torch.long), mask


def _lens_kwargs(kwargs: dict) -> dict:
    """TransformerLens's default ``return_type="logits"`` for run_with_*, unless the caller asks for the hidden
    states (probe's analyses: ``return_hidden=True``)."""
    if not kwargs.get("return_hidden"):
        kwargs.setdefault("return_type", "logits")
    return kwargs
