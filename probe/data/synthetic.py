"""Synthetic corpora with unlimited distinct data: the Bigram-Backcopy task (BB; Guo et al. 2024, "Active-Dormant
Attention Heads", arXiv 2410.13835, §2).

A BB task is a fixed random bigram chain over ``vocab`` ordinary tokens (ids 0..vocab-1) plus a BOS (id ``vocab``).
The ``triggers`` tokens with the largest stationary probability are the triggers. A sequence of T+1 tokens is

    x_0 = BOS,  x_1 ~ stationary distribution without the triggers,
    x_{t+1} = x_{t-1}               if x_t is a trigger (back-copy: the token before the trigger),
    x_{t+1} ~ P[x_t, :]             otherwise (the bigram chain).

A copied token is never a trigger and no two triggers are adjacent (x_1 is not a trigger, and a trigger's successor
copies a non-trigger). The chain: a seeded random permutation of Zipf weights (exponent ``ZIPF``) is the prior
π; each row of P is Dirichlet(``CONCENTRATION`` · vocab · π) — sparse rows (about 3.3 bits of entropy at vocab 64,
near a character bigram model) whose stationary distribution leans on a few frequent tokens (the top 3 hold ~18%).
Everything follows from (seed, vocab, triggers, T); the two shape constants are recorded in ``to_identity()``.

Names: ``synthetic:bb`` or ``synthetic:bb[vocab=64,triggers=3,seed=0,T=256]`` (any subset of the keys, any order;
``parse_synthetic(name, base=...)`` fills missing keys from ``base``, e.g. the task recorded in a model's run).

Token domains (Gu et al. 2025, §3.1's random and repeated inputs; docs/definitions.md#token-domains), for any model:
``synthetic:random[T=64,n=100,seed=0]`` — n sequences of token ids drawn uniformly from the model's whole vocabulary
0..V-1 (no id excluded) — and ``synthetic:repeat[T=64,n=100,token=ID]`` — n sequences of one id repeated (without
``token``: each sequence repeats its own id, drawn uniformly). No BOS unless ``bos=1`` (then the tokenizer's BOS
replaces the first drawn token); see ``TokenDomain``.

Training draws come from ``BBSampler`` (``sample(B)`` → (B, T+1) windows; batch k is generated from a generator keyed
by (task, seed, k), so a resumed run sees exactly the batches it would have). Evaluation windows are ``BBWindows``:
fixed (N, B, T+1) windows from a key disjoint from training's, with the masks of which positions follow a trigger.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from probe.data.batches import TokenWindows
from probe.data.limits import check_windows_fit
from probe.data.seeding import keyed_generator

SYNTHETIC_PREFIX = "synthetic:"
TASKS = ("bb",)
ZIPF = 0.5  # exponent of the Zipf prior over tokens
CONCENTRATION = 0.1  # Dirichlet concentration per token of the vocabulary (times the prior)
KEYS = ("vocab", "triggers", "seed", "T")


@dataclass(frozen=True)
class BigramBackcopy:
    vocab: int = 64  # ordinary tokens 0..vocab-1; BOS is id ``vocab``
    triggers: int = 3  # number of trigger tokens (the most frequent under the chain's stationary distribution)
    seed: int = 0  # seed of the chain (the task itself; training draws have their own seed)
    T: int = 256  # tokens a model reads per window (a window holds T+1: BOS + T)

    def __post_init__(self):
        for key in KEYS:
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{key}={value!r} must be an integer")
        if self.vocab < 4:
            raise ValueError(f"vocab={self.vocab} is too small; choose at least 4 tokens")
        if not 1 <= self.triggers <= self.vocab // 2:
            raise ValueError(
                f"triggers={self.triggers} is not valid; choose 1..{self.vocab // 2} (at most half of "
                f"vocab={self.vocab})"
            )
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} is not valid; choose an integer >= 0")
        if self.T < 2:
            raise ValueError(f"T={self.T} is not valid; choose at least 2")

    # ------------------------------------------------------------------ the chain

    @property
    def bos_id(self) -> int:
        return self.vocab

    @property
    def vocab_size(self) -> int:
        """What a model's embedding needs: the ordinary tokens and BOS."""
        return self.vocab + 1

    @cached_property
    def _chain(self) -> tuple[torch.Tensor, torch.Tensor]:
        # the (V, V) float64 chain and its draw's temporaries
        check_windows_fit(4 * self.vocab**2 * 8, f"the bigram chain of {self.spec()}", "choose a smaller vocab")
        rng = np.random.default_rng([self.seed, self.vocab, 0xBB])
        prior = 1.0 / np.arange(1, self.vocab + 1) ** ZIPF
        prior = prior[rng.permutation(self.vocab)] / prior.sum()
        P = rng.dirichlet(CONCENTRATION * self.vocab * prior, size=self.vocab)  # (V, V) rows sum to 1
        P = P / P.sum(1, keepdims=True)
        pi = np.full(self.vocab, 1.0 / self.vocab)
        for _ in range(10_000):  # stationary distribution by power iteration
            nxt = pi @ P
            if np.abs(nxt - pi).max() < 1e-13:
                break
            pi = nxt
        return torch.from_numpy(P), torch.from_numpy(nxt / nxt.sum())

    @property
    def transition(self) -> torch.Tensor:
        """(vocab, vocab) float64 bigram probabilities P[a, b] = p(next = b | current = a)."""
        return self._chain[0]

    @property
    def stationary(self) -> torch.Tensor:
        """(vocab,) float64 stationary distribution of the bigram chain (without back-copies)."""
        return self._chain[1]

    @cached_property
    def trigger_ids(self) -> torch.Tensor:
        """(triggers,) long: the most frequent tokens under the stationary distribution, in decreasing frequency."""
        return torch.argsort(self.stationary, descending=True, stable=True)[: self.triggers]

    @cached_property
    def is_trigger(self) -> torch.Tensor:
        """(vocab + 1,) bool lookup table (BOS is not a trigger)."""
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[self.trigger_ids] = True
        return mask

    @cached_property
    def _cdfs(self) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.stationary.clone()
        first[self.trigger_ids] = 0
        return torch.cumsum(first / first.sum(), 0), torch.cumsum(self.transition, 1)

    @cached_property
    def fingerprint(self) -> str:
        """16 hex digits of a hash of the chain and the triggers (changes if the construction ever does)."""
        h = hashlib.blake2b(digest_size=8)
        h.update(self.transition.numpy().tobytes())
        h.update(self.trigger_ids.numpy().tobytes())
        return h.hexdigest()

    # ------------------------------------------------------------------ sequences

    def generate(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """(n, T+1) LongTensor of BB sequences, BOS first."""
        V, T = self.vocab, self.T
        check_windows_fit(n * (T + 1) * 16, f"{n} sequences of {self.spec()}", "ask for fewer or a smaller T")
        first_cdf, cdf = self._cdfs
        u = torch.rand(T, n, generator=generator, dtype=torch.float64)  # one uniform per drawn token, (T, n)
        seq = torch.empty(n, T + 1, dtype=torch.long)
        seq[:, 0] = self.bos_id
        seq[:, 1] = torch.searchsorted(first_cdf, u[0], right=True).clamp_max(V - 1)
        for t in range(1, T):
            x = seq[:, t]
            drawn = torch.searchsorted(cdf[x], u[t].unsqueeze(1), right=True).squeeze(1).clamp_max(V - 1)
            seq[:, t + 1] = torch.where(self.is_trigger[x], seq[:, t - 1], drawn)
        return seq

    def after_trigger(self, windows: torch.Tensor) -> torch.Tensor:
        """Bool mask of the positions whose token follows a trigger (a back-copy), same shape as ``windows``."""
        out = torch.zeros_like(windows, dtype=torch.bool)
        out[..., 1:] = self.is_trigger[windows[..., :-1]]
        return out

    def sampler(self, seed: int = 0) -> BBSampler:
        return BBSampler(self, seed)

    def eval_windows(self, n_batches: int = 32, batch_size: int = 8, seed: int = 0) -> BBWindows:
        """Fixed evaluation windows, (n_batches, batch_size, T+1); drawn from a key no training batch uses."""
        if n_batches < 1 or batch_size < 1:
            raise ValueError(f"n_batches={n_batches} and batch_size={batch_size} must both be at least 1")
        tokens = self.generate(n_batches * batch_size, keyed_generator("bb-eval", self.spec(), seed))
        doc_ids = torch.arange(n_batches * batch_size).view(n_batches, batch_size)  # each window its own sequence
        return BBWindows(tokens.view(n_batches, batch_size, self.T + 1), doc_ids, self, seed)

    # ------------------------------------------------------------------ identity

    def spec(self) -> str:
        """The canonical name: ``synthetic:bb[vocab=64,triggers=3,seed=0,T=256]``."""
        return f"{SYNTHETIC_PREFIX}bb[" + ",".join(f"{k}={getattr(self, k)}" for k in KEYS) + "]"

    def to_identity(self) -> dict:
        """What a run records about its data: enough to rebuild the task and to check it is the same chain."""
        return {
            "data": self.spec(),
            "task": "bigram-backcopy",
            "vocab": self.vocab,
            "triggers": self.triggers,
            "seed": self.seed,
            "T": self.T,
            "bos_id": self.bos_id,
            "vocab_size": self.vocab_size,
            "trigger_ids": self.trigger_ids.tolist(),
            "zipf": ZIPF,
            "concentration": CONCENTRATION,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_identity(cls, identity: dict) -> BigramBackcopy:
        task = cls(**{k: identity[k] for k in KEYS})
        if identity.get("fingerprint") not in (None, task.fingerprint):
            raise ValueError(
                f"the recorded chain {identity['fingerprint']} differs from the one {task.spec()} "
                f"builds now ({task.fingerprint}); the generator changed since the run was recorded"
            )
        return task


class BBSampler:
    """Training draws for ``probe.train``: ``sample(B)`` → (B, T+1) BB windows; batch k comes from a generator keyed
    by (task, seed, k), so the state is the count of batches drawn."""

    def __init__(self, task: BigramBackcopy, seed: int = 0):
        self.task, self.seed, self.count = task, seed, 0

    def sample(self, batch_size: int) -> torch.Tensor:
        g = keyed_generator("bb-train", self.task.spec(), self.seed, self.count)
        self.count += 1
        return self.task.generate(batch_size, g)

    def state_dict(self) -> dict:
        return {"task": self.task.spec(), "seed": self.seed, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        if state.get("task") != self.task.spec():
            raise ValueError(
                f"sampler state is for {state.get('task')!r} but this sampler draws "
                f"{self.task.spec()!r}; resume with the same synthetic task"
            )
        self.seed, self.count = state["seed"], state["count"]


@dataclass
class BBWindows(TokenWindows):
    """Fixed BB evaluation windows, usable wherever analyses take ``data`` (like probe.data.EvalBatches).

    ``tokens`` (N, B, T+1); ``doc_ids`` (N, B) (every window is its own sequence); ``after_trigger`` (N, B, T+1) marks
    the back-copied tokens; ``trigger_rows`` (N, B, T) marks the model's input rows that hold a trigger (the query whose
    next-token target is a back-copy)."""

    tokens: torch.Tensor
    doc_ids: torch.Tensor
    task: BigramBackcopy
    seed: int

    @property
    def ctx(self) -> int:
        return self.tokens.shape[-1] - 1

    @property
    def corpus(self) -> str:  # what text windows call their corpus: here the task's canonical name
        return self.task.spec()

    @property
    def mode(self) -> str:
        return "synthetic"

    @property
    def after_trigger(self) -> torch.Tensor:
        return self.task.after_trigger(self.tokens)

    @property
    def trigger_rows(self) -> torch.Tensor:
        return self.task.is_trigger[self.inputs]

    def to_dict(self) -> dict:
        return {
            "corpus": self.corpus,
            "corpus_fingerprint": self.task.fingerprint,
            "tokenizer": None,
            "mode": self.mode,
            "seed": self.seed,
            "ctx": self.ctx,
            "n_batches": len(self),
            "batch_size": self.batch_size,
            "n_documents": len(self) * self.batch_size,
            "bos": True,
            "trigger_ids": self.task.trigger_ids.tolist(),
        }


# ---------------------------------------------------------------------- token domains (Gu et al.'s random / repeated)

TOKEN_DOMAINS = ("random", "repeat")
TOKEN_KEYS = {"random": ("T", "n", "seed", "bos"), "repeat": ("T", "n", "token", "seed", "bos")}


MAX_DOMAIN_IDS = 2**25  # ids of one token domain (n x (T+1)): 256 MiB as int64, far past any evaluation's need


@dataclass(frozen=True)
class TokenDomain:
    """Sequences of token ids built without text, for any model of vocabulary V (docs/definitions.md#token-domains).

    Every sequence holds T+1 ids (the model reads T; the last is a target only), drawn with
    ``torch.Generator().manual_seed(seed)``: ``random`` — ``torch.randint(0, V, (n, T+1))``, uniform over every id the
    model can embed; ``repeat`` — ``token`` repeated, or without it one id per sequence, ``torch.randint(0, V, (n,))``.
    Gu et al.'s released code builds only natural-text inputs; the paper's random and repeated inputs carry no BOS
    (a repeated-token sequence is then the same token at every position, the case in which they find no sink in
    RoPE models), so ``bos=0`` is the default; ``bos=1`` puts the tokenizer's BOS at position 0 instead of the first
    drawn id."""

    kind: str = "random"  # one of TOKEN_DOMAINS
    T: int = 64  # tokens a model reads per sequence
    n: int = 100  # sequences
    seed: int = 0
    token: int | None = None  # repeat: the id repeated; None: each sequence repeats its own uniformly drawn id
    bos: int = 0  # 1: the tokenizer's BOS at position 0

    def __post_init__(self):
        if self.kind not in TOKEN_DOMAINS:
            raise ValueError(f"unknown token domain {self.kind!r}; choose one of: {', '.join(TOKEN_DOMAINS)}")
        for key in ("T", "n", "seed", "bos") + (("token",) if self.token is not None else ()):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{key}={value!r} must be an integer")
        if self.token is not None and self.kind != "repeat":
            raise ValueError(
                f"token={self.token} applies to synthetic:repeat only; keys of synthetic:{self.kind}: "
                f"{', '.join(TOKEN_KEYS[self.kind])}"
            )
        if self.T < 2:
            raise ValueError(f"T={self.T} is not valid; choose at least 2")
        if self.n < 1:
            raise ValueError(f"n={self.n} is not valid; choose at least 1")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} is not valid; choose an integer >= 0")
        if self.bos not in (0, 1):
            raise ValueError(f"bos={self.bos} is not valid; choose 0 (no BOS) or 1 (the tokenizer's BOS first)")
        if self.token is not None and self.token < 0:
            raise ValueError(f"token={self.token} is not valid; choose a token id >= 0")
        if self.n * (self.T + 1) > MAX_DOMAIN_IDS:  # checked with the name, before any model loads
            raise ValueError(
                f"n={self.n} sequences of T+1={self.T + 1} ids are {self.n * (self.T + 1):,} ids; a token domain holds "
                f"at most {MAX_DOMAIN_IDS:,} (256 MiB): choose a smaller n or T"
            )

    def spec(self) -> str:
        """The canonical name, e.g. ``synthetic:repeat[T=64,n=100,seed=0,bos=0]``."""
        keys = [k for k in TOKEN_KEYS[self.kind] if k != "token" or self.token is not None]
        return f"{SYNTHETIC_PREFIX}{self.kind}[" + ",".join(f"{k}={getattr(self, k)}" for k in keys) + "]"

    def generate(self, vocab_size: int, bos_id: int | None = None) -> torch.Tensor:
        """(n, T+1) LongTensor of ids below ``vocab_size``; ``bos_id`` at position 0 when ``bos=1`` (required then)."""
        if self.token is not None and self.token >= vocab_size:
            raise ValueError(f"token={self.token} is beyond the model's vocabulary; choose 0..{vocab_size - 1}")
        if self.bos and bos_id is None:
            raise ValueError("bos=1 but the model's tokenizer has no BOS token; use bos=0")
        check_windows_fit(
            self.n * (self.T + 1) * 8, f"n={self.n} sequences of T+1={self.T + 1} ids", "choose a smaller n or T"
        )
        g = torch.Generator().manual_seed(self.seed)
        if self.kind == "random":
            ids = torch.randint(0, vocab_size, (self.n, self.T + 1), generator=g)
        else:
            one = (
                torch.full((self.n,), self.token, dtype=torch.long)
                if self.token is not None
                else torch.randint(0, vocab_size, (self.n,), generator=g)
            )
            ids = one[:, None].expand(self.n, self.T + 1).clone()
        if self.bos:
            ids[:, 0] = bos_id
        return ids

    def windows(self, vocab_size: int, bos_id: int | None = None, batch_size: int = 8) -> TokenDomainWindows:
        """The n sequences as fixed windows (no sequence dropped: ``probe.data.windows.batch_layout``)."""
        from probe.data.windows import batch_layout

        ids = self.generate(vocab_size, bos_id)
        nb, b = batch_layout(self.n, batch_size)
        return TokenDomainWindows(
            ids.view(nb, b, self.T + 1),
            torch.arange(self.n).view(nb, b),
            self,
            vocab_size,
            bos_id if self.bos else None,
        )


@dataclass
class TokenDomainWindows(TokenWindows):
    """A token domain's sequences as evaluation windows, usable wherever analyses take ``data``."""

    tokens: torch.Tensor
    doc_ids: torch.Tensor
    domain: TokenDomain
    vocab_size: int
    bos_id: int | None

    @property
    def ctx(self) -> int:
        return self.tokens.shape[-1] - 1

    @property
    def corpus(self) -> str:
        return self.domain.spec()

    @property
    def mode(self) -> str:
        return "synthetic"

    def to_dict(self) -> dict:
        h = hashlib.blake2b(self.tokens.numpy().tobytes(), digest_size=8).hexdigest()
        draw = (
            "uniform over ids 0..V-1, none excluded"
            if self.domain.kind == "random"
            else f"id {self.domain.token} repeated"
            if self.domain.token is not None
            else "one id per sequence, uniform over 0..V-1, repeated"
        )
        return {
            "corpus": self.corpus,
            "corpus_fingerprint": h,
            "tokenizer": None,
            "mode": self.mode,
            "seed": self.domain.seed,
            "ctx": self.ctx,
            "n_batches": len(self),
            "batch_size": self.batch_size,
            "n_documents": self.domain.n,
            "bos": bool(self.domain.bos),
            "bos_id": self.bos_id,
            "vocab_size": self.vocab_size,
            "draw": draw,
        }


# ---------------------------------------------------------------------- names

_NAME = re.compile(r"^synthetic:(?P<task>[^\[\]]*)(?:\[(?P<args>[^\[\]]*)\])?$")


def is_synthetic(name) -> bool:
    return isinstance(name, str) and name.startswith(SYNTHETIC_PREFIX)


def parse_synthetic(name: str, base: BigramBackcopy | None = None) -> BigramBackcopy:
    """``synthetic:bb[vocab=64,triggers=3,seed=0,T=256]`` → BigramBackcopy. Keys left out come from ``base`` (e.g. the
    task a model was trained on), else the defaults. Errors are one line naming the bad part and the valid choices."""
    m = _NAME.match(name.strip()) if isinstance(name, str) else None
    if m is None:
        raise ValueError(
            f"{name!r} is not a synthetic corpus name; write synthetic:bb or "
            f"synthetic:bb[{','.join(f'{k}=N' for k in KEYS)}]"
        )
    if m["task"] not in TASKS:
        raise ValueError(f"unknown synthetic task {m['task']!r} in {name!r}; choose one of: {', '.join(TASKS)}")
    values = {k: getattr(base or BigramBackcopy(), k) for k in KEYS}
    return BigramBackcopy(**{**values, **_integer_args(m["args"], name, KEYS)})


def _integer_args(args: str | None, name: str, keys) -> dict[str, int]:
    """The ``key=N,...`` inside a synthetic name's brackets, each key one of ``keys`` at most once (one-line errors
    naming the bad part and the valid keys)."""
    values: dict[str, int] = {}
    for part in args.split(",") if args and args.strip() else []:
        key, eq, value = (s.strip() for s in part.partition("="))
        if not eq or not key:
            raise ValueError(f"{part.strip()!r} in {name!r} is not key=value; keys: {', '.join(keys)}")
        if key not in keys:
            raise ValueError(f"unknown key {key!r} in {name!r}; valid keys: {', '.join(keys)}")
        if key in values:
            raise ValueError(f"key {key!r} given twice in {name!r}")
        if not re.fullmatch(r"[+-]?\d+", value):
            raise ValueError(f"{key}={value!r} in {name!r} must be an integer")
        values[key] = int(value)
    return values


def is_token_domain(name) -> bool:
    """True for ``synthetic:random[...]`` / ``synthetic:repeat[...]`` names (well-formed or not)."""
    m = _NAME.match(name.strip()) if is_synthetic(name) else None
    return m is not None and m["task"] in TOKEN_DOMAINS


def parse_token_domain(name: str, n: int | None = None) -> TokenDomain:
    """``synthetic:random[T=64,n=100,seed=0]`` / ``synthetic:repeat[T=64,n=100,token=ID]`` → TokenDomain (missing keys:
    the defaults; ``n``, where given, is the count when the name has none: the verbs pass --batches × --batch-size).
    Errors are one line naming the bad part and the valid choices."""
    m = _NAME.match(name.strip()) if isinstance(name, str) else None
    if m is None or m["task"] not in TOKEN_DOMAINS:
        raise ValueError(
            f"{name!r} is not a token domain name; write synthetic:random[T=64,n=100,seed=0] or "
            "synthetic:repeat[T=64,n=100,token=ID]"
        )
    kind = m["task"]
    values = _integer_args(m["args"], name, TOKEN_KEYS[kind])
    if n is not None:
        values.setdefault("n", n)
    return TokenDomain(kind, **values)


__all__ = [
    "TokenDomain",
    "TokenDomainWindows",
    "parse_token_domain",
    "is_token_domain",
    "TOKEN_DOMAINS",
    "BigramBackcopy",
    "BBSampler",
    "BBWindows",
    "parse_synthetic",
    "is_synthetic",
    "SYNTHETIC_PREFIX",
    "TASKS",
    "keyed_generator",
]
