"""LR-AttnRes's released checkpoints (jon123boss/LR-AttnRes, Jonnester/LR-AttnRes-*) as probe models.

Their released models are training checkpoints: the dict ``train.py``'s ``build_checkpoint`` makes (``model``: the
``OBPM`` state dict, ``model_args``: ``asdict(ModelConfig)``, optimiser and scheduler states, the training
``config``), written by ``torch.save`` and uploaded as ``final_model.pt`` (``upload_full_run_checkpoint``). It is
read here with ``torch.load(weights_only=True)`` (tensors and plain containers only; nothing is executed), its
``model_args`` mapped onto ProbeConfig's depth routing (docs/definitions.md#released-checkpoints) and its state dict
onto probe's parameters. Anything that cannot be mapped is refused in one line (:class:`AuthorsFormatError`).

Read from ``model.py`` / ``train.py`` at commit 14784c7b486f17e0d2fb849c4822cbd9d118d9a6:

* use_attnres without use_lrid: AttnRes (full or block); use_lrid: P-LR (keys projected beside each output), or
  S-LR with lrid_key_from_output_tail; neither: a plain pre-norm residual transformer;
* their norms have no gain and eps=None (torch.finfo(dtype).eps of the activations): probe's gains are ones and its
  norm_eps the finfo eps of the dtype it loads in;
* their RoPE rotates interleaved pairs (2i, 2i+1); probe's q/k rows are permuted to rotate-half pairs (i, i+dh/2);
* fc1 rows [0:m] are the SwiGLU's x, [m:2m] its gate (silu(gate) * x);
* block routing over attnres_num_blocks blocks of 2L sub-layers (ends ceil(2L·i/N)); the block mean and log-count
  prior from attnres_block_average / _average_mode / _count_prior (or attnres_block_alpha / _beta, fixed or
  learned, shared scope);
* S-LR / P-LR logits are multiplied by lrid_logit_scale: probe's queries carry it (probe's logits are unscaled).
"""

from __future__ import annotations

from pathlib import Path

from probe.checkpoints.muddformer import AuthorsFormatError, assemble, check_memory
from probe.hooks import names

# the file name their train.py uploads (upload_full_run_checkpoint) and their loaders look for first
CHECKPOINT_FILE = "final_model.pt"
PAYLOAD_KEYS = ("model", "model_args")
# ModelConfig fields that choose how their code runs, not what it computes (flash-attn, the fused Triton read
# kernels their parity tests check against the plain path, initialisation)
EXECUTION_FIELDS = {
    "flash_attention",
    "use_fused_attnres",
    "attnres_training_cache_phase1",
    "attnres_training_torch_phase2",
    "attnres_fuse_read_norm",
    "init_std",
    "init_cutoff_factor",
    "attn_res_query_init",
    "attnres_block_learned_scale_init",
}
# field -> the only value probe can map (anything else changes the function in a way probe does not have)
REQUIRED = {
    "norm_pos": "before",
    "clip_qkv": None,
    "attnres_block_split_sublayers": False,
    "attnres_block_learned_scale": False,
    "attnres_block_value_norm": False,
    "attnres_key_norm": True,
    "attn_res_query_norm": False,
    "lrid_num_heads": 1,
    "lrid_input_dependent_query": False,
    "lrid_static_embedding_key": False,
    "lrid_add_static_embedding_key": False,
    "lrid_add_static_source_key": False,
    "lrid_key_from_value": False,
    "lrid_key_from_value_shared": False,
    "attnres_block_alpha_scope": "shared",
    "attnres_block_beta_scope": "shared",
}
# fields read only when another is on (the value-key norm with key_from_value, the value queries with an
# input-dependent query): their values change nothing here
INERT_FIELDS = {
    "lrid_key_value_norm",
    "lrid_query_from_value",
    "lrid_query_from_value_shared",
    "lrid_use_logit_scale",
    "mlp_ratio",
}
MAPPED_FIELDS = {
    "block_size",
    "vocab_size",
    "n_layer",
    "n_head",
    "n_embd",
    "mlp_hidden_dim",
    "weight_tying",
    "rope_theta",
    "qk_norm",
    "attnres_type",
    "use_attnres",
    "attnres_num_blocks",
    "attnres_block_average",
    "attnres_block_average_mode",
    "attnres_block_count_prior",
    "attnres_block_alpha",
    "attnres_block_beta",
    "attnres_block_alpha_learned",
    "attnres_block_beta_learned",
    "use_lrid",
    "lrid_rank",
    "lrid_projection_rank",
    "lrid_key_from_output_tail",
    "lrid_logit_scale",
}


def checkpoint_file(path) -> Path | None:
    """The checkpoint a local path names: a ``.pt`` file, or a directory holding ``final_model.pt``."""
    path = Path(path).expanduser()
    if path.is_file() and path.suffix in (".pt", ".pth"):
        return path
    if path.is_dir() and (path / CHECKPOINT_FILE).is_file():
        return path / CHECKPOINT_FILE
    return None


def read_checkpoint(path: Path, name: str) -> dict:
    import pickle

    import torch

    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        why = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise AuthorsFormatError(
            f"{name}: {path.name} cannot be read as weights only (torch.load weights_only=True: {why})"
        ) from None
    if not isinstance(payload, dict) or any(k not in payload for k in PAYLOAD_KEYS):
        have = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
        raise AuthorsFormatError(
            f"{name}: {path.name} is not an LR-AttnRes training checkpoint (needs keys "
            f"'model' and 'model_args'; has {have})"
        )
    return payload


def _block_power(args: dict, kind: str, legacy: float, name: str) -> float:
    value = args.get(f"attnres_block_{kind}", "legacy")
    if value == "legacy":
        return legacy
    if isinstance(value, (list, tuple)):
        if len(set(map(float, value))) != 1:
            raise AuthorsFormatError(
                f"{name}: attnres_block_{kind}={value!r} differs between blocks; probe has one shared value"
            )
        value = value[0]
    return float(value)


def probe_config_kwargs(args: dict, eps: float, name: str = "checkpoint") -> dict:
    """ProbeConfig keyword arguments for their ``model_args`` (after their __post_init__), or AuthorsFormatError."""
    known = MAPPED_FIELDS | EXECUTION_FIELDS | set(REQUIRED) | INERT_FIELDS
    unknown = sorted(set(args) - known)
    if unknown:
        raise AuthorsFormatError(
            f"{name}: model_args field {unknown[0]!r} is not one model.py has at the pinned "
            "commit; probe cannot tell what it does"
        )
    for field, value in REQUIRED.items():
        if field in args and args[field] != value:
            raise AuthorsFormatError(
                f"{name}: {field}={args[field]!r} cannot be mapped onto probe; supported: {value!r}"
            )
    L, d = int(args["n_layer"]), int(args["n_embd"])
    m = args.get("mlp_hidden_dim") or int(d * float(args.get("mlp_ratio") or 4.0))
    kwargs = dict(
        vocab_size=int(args["vocab_size"]),
        n_layers=L,
        d_model=d,
        n_heads=int(args["n_head"]),
        d_mlp=int(m),
        n_ctx=int(args["block_size"]),
        rope_theta=float(args["rope_theta"]),
        qk_norm=bool(args.get("qk_norm", True)),
        tie_embeddings=bool(args.get("weight_tying", False)),
        norm_eps=eps,
    )
    lrid = bool(args.get("use_lrid"))
    if not (args.get("use_attnres") or lrid):
        return kwargs  # their baseline: plain residual stream
    kwargs["depth"] = ("slr" if args.get("lrid_key_from_output_tail") else "plr") if lrid else "attnres"
    if lrid:
        kwargs["depth_rank"] = int(args["lrid_rank"])
    kind = str(args.get("attnres_type") or "block").lower()
    if kind == "block":
        n = min(int(args["attnres_num_blocks"]), 2 * L)
        if (2 * L) % n:
            raise AuthorsFormatError(
                f"{name}: attnres_num_blocks={n} does not divide 2L={2 * L} sub-layers (their "
                "blocks are then uneven; probe's are equal)"
            )
        mode = str(args.get("attnres_block_average_mode") or "count").lower()
        mean = (0.5 if mode == "sqrt" else 1.0) if args.get("attnres_block_average", True) else 0.0
        prior = 1.0 if args.get("attnres_block_count_prior", True) else 0.0
        kwargs.update(
            depth_blocks=n,
            depth_block_mean=_block_power(args, "alpha", mean, name),
            depth_block_prior=_block_power(args, "beta", prior, name),
            depth_block_mean_learned=bool(args.get("attnres_block_alpha_learned")),
            depth_block_prior_learned=bool(args.get("attnres_block_beta_learned")),
        )
    elif kind != "full":
        raise AuthorsFormatError(f"{name}: attnres_type={kind!r} cannot be mapped; supported: 'full', 'block'")
    return kwargs


def interleaved_to_half(w, n_heads: int):
    """Rows of a q/k projection from their RoPE layout (pairs 2i, 2i+1 in each head) to probe's (pairs i, i+dh/2)."""
    import torch

    d_head = w.shape[0] // n_heads
    perm = torch.cat([torch.arange(0, d_head, 2), torch.arange(1, d_head, 2)])
    return w.view(n_heads, d_head, -1)[:, perm].reshape(w.shape)


def site_of_residual_index(t: int, n_layers: int) -> str:
    """Their residual index t (the read before sub-layer t; 2L: before the final norm) -> probe's read site."""
    if t == 2 * n_layers:
        return names.read_site(None)
    return names.read_site(t // 2, "mlp" if t % 2 else "attn")


def map_state_dict(theirs: dict, config, args: dict, name: str = "checkpoint") -> dict:
    """Their OBPM state dict -> probe's; AuthorsFormatError on a missing or leftover name."""
    import torch

    c, d, m = config, config.d_model, config.d_mlp
    lrid, plr = bool(args.get("use_lrid")), config.depth == "plr"
    r = config.depth_rank or 0
    prefix = "_orig_mod."  # a compiled model's state dict (their loaders strip it too)
    theirs = {k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in theirs.items()}
    theirs = {k: v for k, v in theirs.items() if not k.endswith((".rope.sin", ".rope.cos"))}  # RoPE tables
    used = set()

    def get(key: str):
        if key not in theirs:
            raise AuthorsFormatError(f"{name}: weight {key!r} is missing (an OBPM of these model_args has it)")
        used.add(key)
        return theirs[key]

    ones = lambda n: torch.ones(n, dtype=theirs["transformer.wte.weight"].dtype)  # noqa: E731  (their norms: no gain)
    out = {"embed.weight": get("transformer.wte.weight"), "ln_f.weight": ones(d)}
    if not c.tie_embeddings:
        out["lm_head.weight"] = get("lm_head.weight")
    if plr:
        out["embed_key.weight"] = get("transformer.lrid_embedding_key.proj.weight")
    for l in range(c.n_layers):
        p, a = names.block(l) + ".", f"transformer.layers.{l}."
        qkv = get(a + "attn.c_attn.weight")
        out[p + "attn.q_proj.weight"] = interleaved_to_half(qkv[:d], c.n_heads)
        out[p + "attn.k_proj.weight"] = interleaved_to_half(qkv[d : 2 * d], c.n_heads)
        out[p + "attn.v_proj.weight"] = qkv[2 * d :]
        o = get(a + "attn.c_proj.proj.weight" if lrid else a + "attn.c_proj.weight")
        fc1 = get(a + "mlp.fc1.weight")
        down = get(a + "mlp.fc2.proj.weight" if lrid else a + "mlp.fc2.weight")
        out[p + "attn.o_proj.weight"], out[p + "mlp.down.weight"] = o[:d], down[:d]
        out[p + "mlp.up.weight"], out[p + "mlp.gate.weight"] = fc1[:m], fc1[m:]
        if plr:  # key rows follow the output rows (rows past d + r: their projection_rank slack, unused)
            out[p + "attn.key_proj.weight"], out[p + "mlp.key_proj.weight"] = o[d : d + r], down[d : d + r]
        for norm in ("ln1", "ln2"):
            out[p + norm + ".weight"] = ones(d)
        if c.qk_norm:
            out[p + "attn.q_norm.weight"], out[p + "attn.k_norm.weight"] = ones(c.d_head), ones(c.d_head)
    if c.depth != "residual":
        scale = float(args.get("lrid_logit_scale") or 1.0) if lrid else 1.0
        for t in range(1, 2 * c.n_layers + 1):
            q = (
                get(f"transformer.lrid_queries.{t - 1}")[0]
                if lrid
                else get(f"transformer.attn_residuals.{t - 1}.query")
            )
            out[site_of_residual_index(t, c.n_layers) + ".query"] = q * scale
        for kind, field in (("alphas", "depth_block_mean"), ("betas", "depth_block_prior")):
            if getattr(c, field + "_learned"):
                out[field] = get(f"transformer.attnres_block_{kind}").reshape(-1)[0]
    left = sorted(set(theirs) - used)
    if left:
        raise AuthorsFormatError(
            f"{name}: weight {left[0]!r} has no place in probe's model of these model_args ({len(left)} such)"
        )
    return out


def load_lr_attnres(path, *, name: str | None = None, dtype=None):
    """An LR-AttnRes training checkpoint (final_model.pt, or a directory holding it) -> ProbeForCausalLM."""
    import torch

    from probe.models.config import ProbeConfig

    file = checkpoint_file(path)
    name = name or str(path)
    if file is None:
        raise AuthorsFormatError(f"{name}: no {CHECKPOINT_FILE} (or .pt file) there")
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
    payload = read_checkpoint(file, name)  # memory-mapped: the optimiser states are never read into memory
    tensors = payload["model"].values() if isinstance(payload["model"], dict) else []
    check_memory(0, sum(t.numel() for t in tensors if hasattr(t, "numel")), dtype, name)
    args = payload["model_args"]
    if not isinstance(args, dict):
        raise AuthorsFormatError(f"{name}: model_args is a {type(args).__name__}, not their asdict(ModelConfig)")
    from probe.checkpoints.sizes import check_config

    check_config(args, name, "model_args")  # before any size is used: an absurd one is one line, not an allocation
    pc = ProbeConfig(**probe_config_kwargs(args, torch.finfo(dtype).eps, name))
    mapped = map_state_dict(payload["model"], pc, args, name)
    return assemble(
        pc,
        mapped,
        dtype,
        name,
        "model_args",
        {
            "format": "lr-attnres",
            "repository": "jon123boss/LR-AttnRes",
            "step": payload.get("step"),
            "tokens_processed": payload.get("tokens_processed"),
        },
    )
