"""LR-AttnRes's released checkpoints (jon123boss/LR-AttnRes, Jonnester/LR-AttnRes-*) as probe models.

Their released models are training checkpoints: the dict ``train.py``'s ``build_checkpoint`` makes (``model``: the
``OBPM`` state dict, ``model_args``: ``asdict(ModelConfig)``, optimiser and scheduler states, the training
``config``), written by ``torch.save`` and uploaded as ``final_model.pt`` (``upload_full_run_checkpoint``). It is
read here with ``torch.load(weights_only=True)`` (tensors and plain containers only; nothing is executed), its
``model_args`` mapped onto ProbeConfig's depth routing (docs/definitions.md#released-checkpoints) and its state dict
onto probe's parameters, as the version of their code whose ModelConfig fields the model_args hold computed it
(FIELD_VERSIONS, ABSENT; recorded in config.authors_format), with the RoPE table stored in the checkpoint unless
rope="exact". Anything that cannot be mapped is refused in one line (:class:`AuthorsFormatError`).

Read from ``model.py`` / ``train.py`` at every commit from 092e6da to 14784c7b486f17e0d2fb849c4822cbd9d118d9a6:

* use_attnres without use_lrid: AttnRes (full or block); use_lrid: P-LR (keys projected beside each output), or
  S-LR with lrid_key_from_output_tail; neither: a plain pre-norm residual transformer;
* their norms have no gain and eps=None, which F.rms_norm reads as the machine epsilon of the type it computes in
  (fp64 for fp64, else fp32: bf16 activations get fp32's 1.2e-7, not bf16's 7.8e-3): probe's gains are ones and its
  norm_eps that epsilon for the dtype it loads in;
* their RoPE rotates interleaved pairs (2i, 2i+1); probe's q/k rows are permuted to rotate-half pairs (i, i+dh/2);
* fc1 rows [0:m] are the SwiGLU's x, [m:2m] its gate (silu(gate) * x);
* block routing over attnres_num_blocks blocks of 2L sub-layers (ends ceil(2L·i/N)); the block mean and log-count
  prior from attnres_block_average / _average_mode / _count_prior (or attnres_block_alpha / _beta, fixed or
  learned, shared scope);
* S-LR / P-LR logits are multiplied by lrid_logit_scale: probe's queries carry it (probe's logits are unscaled);
* each layer's RotaryEmbedding keeps its table as buffers (rope.sin / rope.cos, (1, 1, block_size, dh/2)), in the
  dtype the model was saved in; their forward asserts T <= block_size.
"""

from __future__ import annotations

from pathlib import Path

from probe.checkpoints.muddformer import AuthorsFormatError, assemble, check_memory, check_rope, probe_config
from probe.hooks import names

REPOSITORY = "jon123boss/LR-AttnRes"
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


# The ModelConfig fields each version of their model.py added after the first whose fields a released checkpoint has
# (092e6da, 2026-06-04; 1c3c76d, whose train.py first builds this checkpoint, has the same): a checkpoint's
# model_args are asdict(ModelConfig) of the code that wrote it, so they hold exactly that version's fields (git log
# on model.py; tests/fixtures/authors/lr-attnres-versions runs every version's OBPM on the same weights).
FIRST, LAST = ("092e6da", "2026-06-04"), ("14784c7", "2026-06-13")
FIELD_VERSIONS = (
    (
        "e086c36",
        "2026-06-08",
        (
            "use_fused_attnres",
            "attnres_training_cache_phase1",
            "attnres_training_torch_phase2",
            "attnres_fuse_read_norm",
            "lrid_projection_rank",
        ),
    ),
    ("bd67ac0", "2026-06-08", ("lrid_key_from_output_tail",)),
    ("833f331", "2026-06-09", ("attnres_block_average_mode",)),
    (
        "863a0d5",
        "2026-06-10",
        ("attnres_block_learned_scale", "attnres_block_learned_scale_init", "attnres_block_value_norm"),
    ),
    ("65c65f4", "2026-06-10", ("attnres_block_count_prior",)),
    (
        "7dbb9be",
        "2026-06-11",
        (
            "attnres_block_alpha",
            "attnres_block_beta",
            "attnres_block_alpha_learned",
            "attnres_block_beta_learned",
            "attnres_block_alpha_scope",
            "attnres_block_beta_scope",
        ),
    ),
    ("071c87d", "2026-06-13", ("attnres_block_split_sublayers",)),
)
# A field's absence means what the code before it computed. Each field's default is that behaviour, except the
# log-count prior: before 0f5cf7e their block reads had none; 0f5cf7e (2026-06-10 16:32) added it unconditionally and
# 65c65f4, 16 minutes later, the field that turns it off. Checkpoints of 0f5cf7e carry the same fields as older ones:
# their absence is read as the older code's (prior off), the behaviour of every other version without the field.
ABSENT = {
    "lrid_projection_rank": None,
    "lrid_key_from_output_tail": False,
    "attnres_block_average_mode": "count",
    "attnres_block_learned_scale": False,
    "attnres_block_learned_scale_init": "count",
    "attnres_block_value_norm": False,
    "attnres_block_count_prior": False,
    "attnres_block_alpha": "legacy",
    "attnres_block_beta": "legacy",
    "attnres_block_alpha_learned": False,
    "attnres_block_beta_learned": False,
    "attnres_block_alpha_scope": "shared",
    "attnres_block_beta_scope": "shared",
    "attnres_block_split_sublayers": False,
    "use_fused_attnres": False,
    "attnres_training_cache_phase1": True,
    "attnres_training_torch_phase2": True,
    "attnres_fuse_read_norm": True,
}
PRIOR_NOTE = (
    "absent: no log-count prior, as their code before 0f5cf7e (2026-06-10 16:32); 0f5cf7e itself, 16 minutes before "
    "65c65f4 added the field, applied it"
)

READS = (
    f"{REPOSITORY} model.py from {FIRST[0]} ({FIRST[1]}) to {LAST[0]} ({LAST[1]}): a ModelConfig field the "
    "checkpoint's model_args lack means what the code before it computed (attnres_block_count_prior: "
    f"{PRIOR_NOTE}); RoPE: the table stored in the checkpoint (rope='exact': probe's fp32 table); a field set no "
    "version had is refused"
)


def code_version(args: dict, name: str = "checkpoint") -> tuple[dict, dict]:
    """(model_args with each absent field filled by ABSENT, the record of the code version they imply and what was
    assumed), or AuthorsFormatError for a field set no version of their ModelConfig had."""
    known = MAPPED_FIELDS | EXECUTION_FIELDS | set(REQUIRED) | INERT_FIELDS
    added = {f for _, _, fields in FIELD_VERSIONS for f in fields}
    span = f"{FIRST[0]} ({FIRST[1]}) to {LAST[0]} ({LAST[1]})"
    unknown = sorted(set(args) - known)
    if unknown:
        raise AuthorsFormatError(
            f"{name}: model_args field {unknown[0]!r} is in none of the versions of their ModelConfig probe reads "
            f"({span}, but for 0c4f10e's liger-kernel switches, removed an hour later); probe cannot tell what it does"
        )
    lacking = sorted(known - added - set(args))
    if lacking:
        raise AuthorsFormatError(
            f"{name}: model_args lack {lacking[0]!r}, which every version of their ModelConfig from {span} has"
        )
    have = [all(f in args for f in fields) for _, _, fields in FIELD_VERSIONS]
    n = have.index(False) if False in have else len(have)  # the versions whose fields are all there
    for i, (commit, date, fields) in enumerate(FIELD_VERSIONS):
        present = [f for f in fields if f in args]
        if present and i >= n:
            raise AuthorsFormatError(
                f"{name}: model_args have {present[0]!r} (added at {commit}, {date}) but not every field of the "
                "versions up to it; no version of their ModelConfig has these fields"
            )
    since = FIELD_VERSIONS[n - 1][:2] if n else FIRST
    until = FIELD_VERSIONS[n][:2] if n < len(FIELD_VERSIONS) else None
    absent = {f: v for f, v in ABSENT.items() if f not in args}
    code = f"jon123boss/LR-AttnRes model.py from {since[0]} ({since[1]})" + (
        f", before {until[0]} ({until[1]})" if until else f" to {LAST[0]} ({LAST[1]})"
    )
    assumed = {f: repr(v) for f, v in absent.items()}
    if "attnres_block_count_prior" in absent:
        assumed["attnres_block_count_prior"] = PRIOR_NOTE
    return {**absent, **args}, {"code": code, **({"assumed": assumed} if assumed else {})}


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


def probe_config_kwargs(args: dict, eps: float, name: str = "checkpoint", rope: str = "authors") -> dict:
    """ProbeConfig keyword arguments for their ``model_args`` (after their __post_init__), or AuthorsFormatError.
    ``rope``: "authors" reads the RoPE table their checkpoint stores (rope_table="stored"), "exact" probe's own."""
    check_rope(rope, name)
    args, version = code_version(args, name)
    for field, value in REQUIRED.items():
        if args[field] != value:
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
        strict_ctx=True,  # their forward asserts T <= block_size (and their table has block_size rows)
        rope_theta=float(args["rope_theta"]),
        rope_table="stored" if rope == "authors" else "exact",
        qk_norm=bool(args["qk_norm"]),
        tie_embeddings=bool(args["weight_tying"]),
        norm_eps=eps,
        authors_format={"format": "lr-attnres", "repository": REPOSITORY, **version, "rope": rope},
    )
    lrid = bool(args["use_lrid"])
    if not (args["use_attnres"] or lrid):
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
        mode = str(args["attnres_block_average_mode"] or "count").lower()
        if mode not in ("count", "sqrt"):
            raise AuthorsFormatError(f"{name}: attnres_block_average_mode={mode!r}; their code has 'count' and 'sqrt'")
        mean = (0.5 if mode == "sqrt" else 1.0) if args["attnres_block_average"] else 0.0
        prior = 1.0 if args["attnres_block_count_prior"] else 0.0
        kwargs.update(
            depth_blocks=n,
            depth_block_mean=_block_power(args, "alpha", mean, name),
            depth_block_prior=_block_power(args, "beta", prior, name),
            depth_block_mean_learned=bool(args["attnres_block_alpha_learned"]),
            depth_block_prior_learned=bool(args["attnres_block_beta_learned"]),
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
        for t in ("cos", "sin"):  # their RoPE table, (1, 1, block_size, dh/2) per layer: used, or probe's own
            table = get(f"{a}attn.rope.{t}")
            if c.rope_table == "stored":
                out[p + f"attn.rotary.{t}"] = table.reshape(table.shape[-2:])
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


def load_lr_attnres(path, *, name: str | None = None, dtype=None, rope: str = "authors"):
    """An LR-AttnRes training checkpoint (final_model.pt, or a directory holding it) -> ProbeForCausalLM. ``rope``:
    "authors" uses the RoPE table stored in it (bf16-rounded when they saved in bf16), "exact" probe's fp32 table."""
    import torch

    file = checkpoint_file(path)
    name = name or str(path)
    if file is None:
        raise AuthorsFormatError(f"{name}: no {CHECKPOINT_FILE} (or .pt file) there")
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
    payload = read_checkpoint(file, name)  # memory-mapped: the optimiser states are never read into memory
    tensors = payload["model"].values() if isinstance(payload["model"], dict) else []
    check_memory(0, sum(t.numel() for t in tensors if hasattr(t, "numel")), dtype, name)
    return from_payload(payload, name, dtype, rope)


def from_payload(payload: dict, name: str, dtype, rope: str = "authors"):
    """probe's model of their checkpoint dict (``model`` state dict and ``model_args``), in ``dtype``."""
    import torch

    args = payload["model_args"]
    if not isinstance(args, dict):
        raise AuthorsFormatError(f"{name}: model_args is a {type(args).__name__}, not their asdict(ModelConfig)")
    from probe.checkpoints.sizes import check_config

    check_config(args, name, "model_args")  # before any size is used: an absurd one is one line, not an allocation
    # their norms: F.rms_norm(eps=None), whose eps is the machine epsilon of the type it computes in (fp32 for bf16
    # and fp16 activations, not theirs)
    eps = torch.finfo(torch.promote_types(dtype, torch.float32)).eps
    kwargs = probe_config_kwargs(args, eps, name, rope)
    kwargs["authors_format"].update(
        {k: payload[k] for k in ("step", "tokens_processed") if isinstance(payload.get(k), int)}
    )
    pc = probe_config(kwargs, name)
    mapped = map_state_dict(payload["model"], pc, args, name)
    return assemble(pc, mapped, dtype, name, "model_args")
