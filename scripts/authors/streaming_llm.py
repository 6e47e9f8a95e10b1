"""Golden per-token losses of StreamingLLM's streaming evaluation (Xiao et al., ICLR 2024; mit-han-lab/streaming-llm),
run the way their ``examples/eval_long_ppl.py`` runs it, on tiny random transformers Llama and GPT-NeoX models.

    git -C <mirror> show <commit>:<file> > /tmp/streaming-llm/<file>   (each of FILES; scripts/authors/README.md)
    python scripts/authors/streaming_llm.py --src /tmp/streaming-llm --commit <commit>

Runs in the project's venv (transformers 5.24), like gu2025_sink_eps.py, and imports nothing from probe. Their
evaluation loop (eval_long_ppl.py lines 70-90): one token per forward, ``past_key_values`` carried from step to step
and trimmed after every step by their ``StartRecentKVCache(start_size, recent_size)`` (streaming_llm/kv_cache.py,
imported from their file and run as is), the loss of token idx + 1 from the logits of token idx. transformers 5
carries a ``DynamicCache``; their cache takes and returns a list of [k, v] per layer, so the loop converts between
the two around their call (the only glue of the loop). Three modes per model:

  dense      their loop without a cache policy (``--enable_start_recent_kv_cache`` off): every key kept;
  pos_shift  their cache and their position-shift attention (``--enable_pos_shift``): keys cached **unrotated**, every
             key rotated at its position within the cache at each step, the query at the position transformers gives
             it (the cache's length);
  plain      their cache without position shift: keys cached rotated where they were computed.

Their position-shift forwards (streaming_llm/pos_shift/modify_llama.py, modify_gpt_neox.py) are written for
transformers 4.33's attention signature (``past_key_value`` tuples, per-layer ``rotary_emb(x, seq_len)`` tables,
GPT-NeoX's ``_attn``); transformers 5.24 has none of these, so the two forwards below (``llama_pos_shift_forward``,
``gpt_neox_pos_shift_forward``) are **ports to transformers 5.24**, line for line where the API allows. Their own
``apply_rotary_pos_emb_single`` and ``enable_*_pos_shift_attention`` are imported from their files and run as is
(the ported forward is what their enable function installs). streaming_llm_original.py runs their forwards unported on
transformers 4.33.0: the port gives its every loss, logit and position bit for bit (fp64 and fp32).

Positions, as transformers 5.24 assigns them in this loop (recorded per step in the fixture, ``positions``): the
query's position id is ``cache.get_seq_length()`` = the trimmed cache's length = min(idx, start + recent) (as in the
transformers their code was written for, where it was ``past_key_values[0][0].shape[2]``). So in ``plain`` every
query and new key past the first start + recent tokens sits at the same position start + recent, its cached keys
where they were computed; in ``pos_shift`` the cached keys sit at 0 .. L-1 and the query at L.

The fp64 run patches casts that would truncate fp64 to fp32: transformers' RMSNorm and eager softmax and their
softmax(dtype=fp32) (KEEP_FP64_CASTS_PATCH), and the rotary table, which transformers builds from fp32 angles
(``FP64_ROTARY_PATCH``; with it, rotations at different positions are exact to fp64 on both sides of a comparison).
The fp32 run is unpatched. Writes tests/fixtures/authors/streaming-llm/{llama,gpt-neox}/. Seconds on one core.
"""

from __future__ import annotations

import contextlib

import torch
from common import (
    KEEP_FP64_CASTS_PATCH,
    TINY_LLAMA,
    git_blob_sha1,
    keep_fp64_through_fp32_casts,
    load_module,
    randomize,
    source_parser,
    tiny_llama,
    token_windows,
    versions,
    write_fixture,
)

REPOSITORY = "mit-han-lab/streaming-llm"
FILES = {
    "kv_cache": "streaming_llm/kv_cache.py",
    "llama": "streaming_llm/pos_shift/modify_llama.py",
    "gpt_neox": "streaming_llm/pos_shift/modify_gpt_neox.py",
    "loop": "examples/eval_long_ppl.py",
}
SEED, T = 0, 80  # one stream of T tokens: T - 1 losses
CACHES = ((0, 8), (1, 7), (4, 4), (4, 11), (2, 1), (1, 0))  # (start_size, recent_size): caches of 1 .. 15 keys
LOGIT_ROWS = tuple(range(0, T - 1, 6))  # rows whose logits are kept besides every loss
TINY_GPT_NEOX = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    max_position_embeddings=128,
    # partial rotary (transformers 5's name for rotary_pct): the rotated half is position-shifted, the rest is not
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    layer_norm_eps=1e-5,
    use_parallel_residual=True,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
)
FP64_ROTARY_PATCH = (
    "the model's rotary embedding computes position x inv_freq, cos and sin in fp64 during the fp64 run "
    "(transformers 5.24 forms the angles in fp32)"
)


@contextlib.contextmanager
def fp64_rotary(rope: torch.nn.Module):
    """While active, ``rope`` (a transformers rotary embedding, default type) builds (cos, sin) from fp64 angles."""

    def forward(x, position_ids):
        freqs = position_ids[..., None].double() * rope.inv_freq.double()
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * rope.attention_scaling).to(x.dtype), (emb.sin() * rope.attention_scaling).to(x.dtype)

    rope.forward = forward
    try:
        yield
    finally:
        del rope.forward


def tiny_gpt_neox(seed: int, dtype=torch.float64):
    """A transformers GPTNeoXForCausalLM of TINY_GPT_NEOX, eager attention, weights drawn by ``randomize`` in fp64."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    model = GPTNeoXForCausalLM(GPTNeoXConfig(**TINY_GPT_NEOX, attn_implementation="eager")).to(torch.float64)
    randomize(model, seed)
    return model.to(dtype).eval()


BUILDERS = {"llama": tiny_llama, "gpt_neox": tiny_gpt_neox}  # the tiny model of each family


def rotary_module(model) -> torch.nn.Module:
    return model.base_model.rotary_emb


# ---- the ports (transformers 4.33 -> 5.24) of their position-shift attention forwards -------------------------------


def llama_pos_shift_forward(their, rope):
    """Port of modify_llama.py's ``llama_pos_shift_attention_forward`` to transformers 5.24's LlamaAttention.forward
    (``position_embeddings``/``cache`` arguments, (out, weights) return). ``rope`` stands in for their per-layer
    ``self.rotary_emb(value_states, seq_len=kv_seq_len)`` table; pretraining_tp is 1 (their tp branch is not taken)."""

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        bsz, q_len, _ = hidden_states.size()
        position_ids = kwargs["position_ids"]
        query_states = self.q_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)

        kv_seq_len = key_states.shape[-2]
        if cache is not None:
            kv_seq_len += cache.get_seq_length(self.layer_idx)
        cos, sin = rope(value_states, torch.arange(kv_seq_len, device=value_states.device)[None])
        cos, sin = cos[:, None], sin[:, None]  # (1, 1, kv_seq_len, dim): their cached table's layout
        ### Shift Pos: query pos is min(cache_size, idx)
        query_states = their.apply_rotary_pos_emb_single(query_states, cos, sin, position_ids)

        if cache is not None:  # reuse k, v: the cache holds keys unrotated
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx)

        ### Shift Pos: key pos is the pos in cache
        key_position_ids = torch.arange(kv_seq_len, device=position_ids.device).unsqueeze(0)
        key_states = their.apply_rotary_pos_emb_single(key_states, cos, sin, key_position_ids)

        key_states = their.repeat_kv(key_states, self.num_key_value_groups)
        value_states = their.repeat_kv(value_states, self.num_key_value_groups)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / their.math.sqrt(self.head_dim)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask[..., :kv_seq_len]
        attn_weights = their.nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous().reshape(bsz, q_len, -1)
        return self.o_proj(attn_output), None

    return forward


def gpt_neox_pos_shift_forward(their, rope):
    """Port of modify_gpt_neox.py's ``gpt_neox_pos_shift_attention_forward`` to transformers 5.24's
    GPTNeoXAttention.forward (``layer_past`` a Cache, ``position_embeddings``); their ``self._attn`` (gone in 5.24)
    is written out as transformers 4.33's: baddbmm(q, k^T, alpha=head_size^-0.5), + mask, softmax, .to(v dtype), @ v."""

    def forward(self, hidden_states, attention_mask, layer_past=None, position_embeddings=None, **kwargs):
        position_ids = kwargs["position_ids"]
        bsz, q_len, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states)
        qkv = qkv.view(bsz, q_len, self.config.num_attention_heads, 3 * self.head_size)
        query = qkv[..., : self.head_size].permute(0, 2, 1, 3)
        key = qkv[..., self.head_size : 2 * self.head_size].permute(0, 2, 1, 3)
        value = qkv[..., 2 * self.head_size :].permute(0, 2, 1, 3)
        rotary_ndims = self.rotary_ndims

        query_rot, query_pass = query[..., :rotary_ndims], query[..., rotary_ndims:]
        seq_len = key.shape[-2]
        if layer_past is not None:
            seq_len += layer_past.get_seq_length(self.layer_idx)
        cos, sin = rope(value, torch.arange(seq_len, device=value.device)[None])
        cos, sin = cos[:, None], sin[:, None]  # (1, 1, seq_len, rotary_ndims)
        query = their.apply_rotary_pos_emb_single(query_rot, cos, sin, position_ids)
        query = torch.cat((query, query_pass), dim=-1)

        if layer_past is not None:  # the cache holds keys unrotated
            key, value = layer_past.update(key, value, self.layer_idx)

        key_rot, key_pass = key[..., :rotary_ndims], key[..., rotary_ndims:]
        key_position_ids = torch.arange(seq_len, device=position_ids.device).unsqueeze(0)
        key = their.apply_rotary_pos_emb_single(key_rot, cos, sin, key_position_ids)
        key = torch.cat((key, key_pass), dim=-1)

        # their self._attn, as transformers 4.33 wrote it (norm_factor = head_size ** -0.5; one query: no causal mask)
        n_heads, key_length = query.shape[1], key.shape[-2]
        scores = torch.zeros(bsz * n_heads, q_len, key_length, dtype=query.dtype, device=key.device)
        q, k = query.reshape(bsz * n_heads, q_len, -1), key.reshape(bsz * n_heads, key_length, -1)
        scores = torch.baddbmm(scores, q, k.transpose(1, 2), beta=1.0, alpha=self.head_size**-0.5)
        scores = scores.view(bsz, n_heads, q_len, key_length)
        if attention_mask is not None:
            scores = scores + attention_mask[..., :key_length]
        weights = their.nn.functional.softmax(scores, dim=-1).to(value.dtype)
        out = torch.matmul(weights, value).transpose(1, 2).reshape(bsz, q_len, -1)
        return self.dense(out), None

    return forward


PORTS = {"llama": llama_pos_shift_forward, "gpt_neox": gpt_neox_pos_shift_forward}
FORWARD_NAMES = {"llama": "llama_pos_shift_attention_forward", "gpt_neox": "gpt_neox_pos_shift_attention_forward"}


def enable_pos_shift(their, family: str, model) -> None:
    """Their ``enable_{family}_pos_shift_attention(model)``, run as is, installing the 5.24 port of their forward."""
    port = PORTS[family](their, rotary_module(model))
    setattr(their, FORWARD_NAMES[family], port)
    getattr(their, f"enable_{family}_pos_shift_attention")(model)
    installed = [m for m in model.modules() if getattr(m.forward, "__func__", None) is port]
    assert len(installed) == model.config.num_hidden_layers, "their enable function did not patch every layer"


# ---- their loop ----------------------------------------------------------------------------------------------------


def as_list(cache) -> list:
    """transformers 5's DynamicCache -> their list of [k, v] per layer (k, v (B, H, L, dh))."""
    return [[layer.keys, layer.values] for layer in cache.layers]


def as_cache(kv: list):
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=[(k, v) for k, v in kv])


@torch.no_grad()
def eval_long_ppl(model, ids: torch.Tensor, kv_cache) -> dict:
    """eval_long_ppl.py's loop over one stream ``ids`` (T,): per-token NLLs (T - 1,), the logits of LOGIT_ROWS and the
    position id transformers gave each step's query."""
    loss_fn = torch.nn.CrossEntropyLoss(reduction="none")
    seen: list[int] = []
    hook = model.base_model.layers[0].register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(int(kwargs["position_ids"][0, -1])), with_kwargs=True
    )
    nlls, logits_kept, past_key_values = [], [], None
    try:
        for idx in range(0, ids.numel() - 1):
            input_ids = ids[None, idx : idx + 1]
            cache = None if past_key_values is None else as_cache(past_key_values)
            outputs = model(input_ids, cache=cache, use_cache=True)
            logits = outputs.logits.view(-1, model.config.vocab_size)
            past_key_values = as_list(outputs.cache)
            label = ids[None, idx + 1 : idx + 2].view(-1)
            nlls.append(loss_fn(logits, label))
            if kv_cache is not None:
                past_key_values = kv_cache(past_key_values)
            if idx in LOGIT_ROWS:
                logits_kept.append(logits[0])
    finally:
        hook.remove()
    assert len(seen) == ids.numel() - 1
    return {"nll": torch.cat(nlls), "logits": torch.stack(logits_kept), "positions": torch.tensor(seen)}


def run_family(family: str, their: dict, dtype) -> dict:
    """Every mode and cache of one family at one dtype: {mode/s{start}-r{recent}/{nll,logits,positions}}."""
    build = BUILDERS[family]
    vocab = (TINY_LLAMA if family == "llama" else TINY_GPT_NEOX)["vocab_size"]
    ids = token_windows(SEED, 1, T, vocab)[0]
    plain, shifted = build(SEED, dtype), build(SEED, dtype)
    enable_pos_shift(their[family], family, shifted)
    with contextlib.ExitStack() as patches:
        if dtype == torch.float64:
            patches.enter_context(keep_fp64_through_fp32_casts())
            for m in (plain, shifted):
                patches.enter_context(fp64_rotary(rotary_module(m)))
        return run_modes(their["kv_cache"], plain, shifted, ids, eval_long_ppl)


def run_modes(kv_cache_module, plain, shifted, ids: torch.Tensor, loop) -> dict:
    """``loop`` (a version of their eval loop) without a cache policy on ``plain``, then with their
    StartRecentKVCache of every cache on ``plain`` and on ``shifted`` (position shift enabled):
    {dense/..., plain/s{start}-r{recent}/..., pos_shift/s{start}-r{recent}/...}."""
    out = {f"dense/{name}": value for name, value in loop(plain, ids, None).items()}
    for start, recent in CACHES:
        for mode, model in (("plain", plain), ("pos_shift", shifted)):
            kv_cache = kv_cache_module.StartRecentKVCache(start_size=start, recent_size=recent)
            out |= {f"{mode}/s{start}-r{recent}/{name}": value for name, value in loop(model, ids, kv_cache).items()}
    return out


def load_theirs(src) -> dict:
    """Their kv_cache.py and pos_shift modules, imported from the exported files."""
    names = {"kv_cache": "kv_cache", "llama": "modify_llama", "gpt_neox": "modify_gpt_neox"}
    return {key: load_module(src / FILES[key], f"streaming_llm_{name}") for key, name in names.items()}


def main():
    args = source_parser(__doc__, "folder holding their streaming_llm/ and examples/ at the commit").parse_args()
    their = load_theirs(args.src)
    torch.set_num_threads(1)
    for family, settings in (("llama", TINY_LLAMA), ("gpt_neox", TINY_GPT_NEOX)):
        weights = {k: v.to(torch.float64) for k, v in BUILDERS[family](SEED, torch.float64).state_dict().items()}
        outputs = run_family(family, their, torch.float64)
        outputs |= {f"fp32/{k}": v for k, v in run_family(family, their, torch.float32).items()}
        ids = token_windows(SEED, 1, T, settings["vocab_size"])
        meta = {
            "repository": REPOSITORY,
            "commit": args.commit,
            "files": {FILES[k]: git_blob_sha1(args.src / FILES[k]) for k in ("kv_cache", family, "loop")},
            "config": settings,
            "settings": {
                "model": f"transformers {'LlamaForCausalLM' if family == 'llama' else 'GPTNeoXForCausalLM'} of "
                "config, eager attention, every parameter drawn by common.randomize",
                "seed": SEED,
                "stream_length": T,
                "caches": [list(c) for c in CACHES],
                "logit_rows": list(LOGIT_ROWS),
                "k_seq_dim": 2,
                "v_seq_dim": 2,
            },
            "modes": {
                "dense": "their loop, no cache policy: every key kept",
                "plain": "their loop with StartRecentKVCache(start, recent) after every step, no position shift",
                "pos_shift": "their loop with StartRecentKVCache(start, recent) and their position-shift attention "
                f"(enable_{family}_pos_shift_attention, its forward ported to transformers 5.24)",
            },
            "outputs": {
                "{mode}/s{start}-r{recent}/nll": "(T - 1,) their NLL of token idx + 1 from step idx (dense/: no cache)",
                "{mode}/s{start}-r{recent}/logits": "(len(logit_rows), vocab) the logits of steps logit_rows",
                "{mode}/s{start}-r{recent}/positions": "(T - 1,) the position id transformers gave step idx's query "
                "(the trimmed cache's length, min(idx, start + recent))",
                "fp32/...": "the same in an fp32 run of the same weights (unpatched)",
            },
            "port": "their position-shift forward ported from transformers 4.33's attention signature to 5.24's "
            "(scripts/authors/streaming_llm.py); their apply_rotary_pos_emb_single and enable function run as is; "
            "checked against their unported code on transformers 4.33.0 (transformers-4.33.safetensors, written by "
            "scripts/authors/streaming_llm_original.py)",
            "glue": "transformers 5's DynamicCache converted to their list of [k, v] per layer before their "
            "StartRecentKVCache call and back (DynamicCache(ddp_cache_data=...)) after it",
            "versions": versions("transformers"),
            "patches": [KEEP_FP64_CASTS_PATCH, FP64_ROTARY_PATCH],
        }
        write_fixture(
            f"streaming-llm/{family.replace('_', '-')}",
            weights=weights,
            inputs={"input_ids": ids},
            outputs=outputs,
            meta=meta,
        )


if __name__ == "__main__":
    main()
