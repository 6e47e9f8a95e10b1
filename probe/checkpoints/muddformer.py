"""MUDDFormer's and MUDDPythia's released checkpoints (Caiyun-AI/MUDDFormer) as probe models, without their code.

The authors publish their models in a Hugging Face layout whose config.json names their own modeling code
(``auto_map``, loaded elsewhere with ``trust_remote_code``). Here that config is read as data and mapped onto
ProbeConfig's mechanisms (dense="mudd" with their options; docs/definitions.md#released-checkpoints), and their
state dict onto probe's parameter names; no remote code is imported or run. The model computes what their code
computes on that config.json, in their numerics (their bf16 / fp16 RoPE table unless rope="exact"): a key their
config class lacks is ignored, as their code ignores it (one warning); a config their code cannot run, or that probe
cannot map, is refused in one line (:class:`AuthorsFormatError`) naming the key.

Read from ``pytorch/muddformer/{configuration,modeling}_muddformer.py`` and ``pytorch/muddpythia/…`` at commit
fc067b274a5f14894b2ee299fdcb3c581a092896 (tests/fixtures/authors/mudd*-checkpoint/meta.json records the blob ids):

* head_dim is dim // n_head whatever config.json says (their post-init overwrites it);
* intermediate_size None: MUDDFormer find_multiple(int(2·4·dim/3), 256), MUDDPythia 4·dim;
* the FFN of layer l is round(intermediate_size · (l/(L-1) + 0.5) / 128) · 128 wide (their FeedForward, always);
* the dense network after layer l: C = 4 streams (1 after the last layer) over l + 2 sources, hidden width
  C·(l+2), ×4 on the last layer with expand_last, then (h // 64 + 1)·64 with round64;
* sepln: blocks l > 0 norm the q, k, v streams with attention_norms.{0,1,2}; block 0 with attention_norm;
* MUDDFormer: RMSNorms, SwiGLU (w1 gate, w3 up, w2 down), no biases, rotate-half RoPE over the whole head;
* MUDDPythia: LayerNorms with bias, parallel residual (use_parallel_residual), GELU MLP (w1, w2), biases on every
  attention projection (always) and on the MLP (use_linear_bias), rotate-half RoPE on the first
  int(head_dim · rotary_pct) coordinates of each head;
* QK-norm (use_qk_norm): an RMSNorm with gain over each head, before RoPE; the dense network's RMSNorm has no gain;
* dense=false (with sepln=false): a plain pre-norm transformer, attention from one fused wqkv; the dense networks
  their model still builds are never run; tie_word_embeddings=true: untied (their tie_weights() is a no-op);
* their precompute_freqs_cis returns torch.polar's fp32 table rounded to bf16 (MUDDFormer) / fp16 (MUDDPythia), with
  block_size rows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from probe.hooks import names

MODEL_TYPES = ("muddformer", "muddpythia")
REPOSITORY = "Caiyun-AI/MUDDFormer"
# their pytorch code has one version: added at 9aa4b78 (2025-02-13), unchanged to fc067b2 (git log -- pytorch/)
CODE_VERSION = "pytorch/{kind}/modeling_{kind}.py as added at 9aa4b78 (2025-02-13), unchanged to fc067b2"
# their config classes' fields and defaults (configuration_muddformer.py / configuration_muddpythia.py at fc067b2;
# tests/fixtures/authors/mudd-configs/meta.json records them from the classes): a missing key takes these
FIELDS = {
    "muddformer": dict(
        block_size=2048,
        vocab_size=50432,
        n_layer=32,
        n_head=32,
        dim=2560,
        intermediate_size=None,
        n_local_heads=-1,
        head_dim=64,
        rope_base=10000,
        norm_eps=1e-6,
        use_gradient_checkpointing=False,
        is_training=False,
        use_qk_norm=False,
        pad_token_id=None,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        use_layer_cache=True,
        stack_hidden=False,
        dense=True,
        dynamic_dense=True,
        sepln=True,
        dense_type="qkvr",
        expand_last=False,
        round64=False,
    ),
}
FIELDS["muddpythia"] = {
    **FIELDS["muddformer"],
    "vocab_size": 32000,
    "norm_eps": 1e-5,
    "use_parallel_residual": True,
    "use_linear_bias": True,
    "rotary_pct": 0.25,
}
# what save_pretrained adds beside the fields (their code never reads these)
DATA_KEYS = {"auto_map", "architectures", "model_type", "torch_dtype", "transformers_version", "_name_or_path"}
# the RoPE table their precompute_freqs_cis always returns (ProbeConfig.rope_table for rope="authors")
AUTHORS_ROPE = {"muddformer": "bfloat16", "muddpythia": "float16"}
ROPES = ("authors", "exact")
# what `probe models` says of the format: the code version read and what is assumed
READS = (
    f"{REPOSITORY} pytorch code as added at 9aa4b78 (2025-02-13, unchanged to fc067b2; no field added since): RoPE "
    "table rounded to bf16 (MUDDFormer) / fp16 (MUDDPythia) as their precompute_freqs_cis (rope='exact': probe's "
    "fp32 table); tie_word_embeddings=true computes untied as their no-op tie_weights; config keys their code "
    "ignores are ignored with one warning; what it cannot run (stack_hidden, sepln=false with dense, n_local_heads "
    "other than 1 or n_head, more than block_size tokens, ...) is refused"
)
# their decode-time buffers (setup_caches); a checkpoint saved after setup_caches carries them, they hold no weights
CACHE_BUFFERS = (".kv_cache.k_cache", ".kv_cache.v_cache", "layer_cache.layer_cache")


class AuthorsFormatError(ValueError):
    """An authors' checkpoint that probe cannot map onto its mechanisms; the message is one line."""


def is_mudd_config(config: dict) -> bool:
    return config.get("model_type") in MODEL_TYPES


def check_rope(rope: str, name: str) -> None:
    if rope not in ROPES:
        raise AuthorsFormatError(f"{name}: rope={rope!r} is not valid; choose one of {', '.join(ROPES)}")


def _pretrained_defaults() -> set[str]:
    from transformers import PretrainedConfig

    return set(PretrainedConfig().to_dict())


def ffn_widths(intermediate_size: int, n_layer: int) -> list[int]:
    """Their FeedForward's hidden width per layer (scale_with_layer and round128 are always on in their code)."""
    return [round(intermediate_size * (l / (n_layer - 1) + 0.5) / 128) * 128 for l in range(n_layer)]


def ignored_keys(config: dict, kind: str) -> list[str]:
    """Keys of config.json that neither their config class nor PretrainedConfig defines: their code stores and
    ignores them (PretrainedConfig keeps any extra keyword as an attribute)."""
    known = set(FIELDS[kind]) | DATA_KEYS | _pretrained_defaults()
    return sorted(k for k in config if k not in known)


def settings(config: dict, name: str = "checkpoint") -> dict:
    """Their config class's fields after its __init__ (a missing key: their default; n_local_heads -1: n_head;
    head_dim: dim // n_head), the keys their code ignores warned about once; AuthorsFormatError for a model_type that
    is not theirs."""
    import warnings

    kind = config.get("model_type")
    if kind not in MODEL_TYPES:
        raise AuthorsFormatError(
            f"{name}: model_type={kind!r} is not a MUDD checkpoint; choose one of {', '.join(MODEL_TYPES)}"
        )
    ignored = ignored_keys(config, kind)
    if ignored:
        warnings.warn(
            f"{name}: config keys {kind}'s code does not read, ignored as it ignores them: {', '.join(ignored)}",
            stacklevel=3,
        )
    c = {**FIELDS[kind], **{k: v for k, v in config.items() if k in FIELDS[kind]}}
    if c["n_local_heads"] == -1:
        c["n_local_heads"] = c["n_head"]
    if c["intermediate_size"] is None:
        c["intermediate_size"] = (
            4 * c["dim"] if kind == "muddpythia" else _find_multiple(int(2 * 4 * c["dim"] / 3), 256)
        )
    return {**c, "model_type": kind, "ignored": ignored}


def _refuse_what_their_code_cannot_run(c: dict, name: str) -> None:
    """One line for a config on which their forward fails (each case run on their code:
    tests/fixtures/authors/mudd-configs)."""
    L, H, d, kv = int(c["n_layer"]), int(c["n_head"]), int(c["dim"]), int(c["n_local_heads"])
    why = None
    if L < 2:
        why = f"n_layer={L}: their FFN widths divide by n_layer - 1"
    elif d % H:
        why = f"dim={d} is not a multiple of n_head={H} (their Attention asserts it)"
    elif kv not in (1, H):
        why = f"n_local_heads={kv}: their attention broadcasts keys over heads only for 1 or n_head={H}"
    elif c["dense"] and c["stack_hidden"]:
        why = "stack_hidden=true: their einsum over the hidden-state list fails"
    elif c["dense"] and not c["dynamic_dense"]:
        why = "dynamic_dense=false with dense=true: their blocks then index a tensor as the q/k/v/r streams"
    elif c["dense"] and c["dense_type"] != "qkvr":
        why = f"dense_type={c['dense_type']!r} with dense=true: their blocks run only 'qkvr' streams"
    elif c["dense"] and not c["sepln"]:
        why = "sepln=false with dense=true: their block norms the tuple of streams with one norm and fails"
    elif not c["dense"] and c["sepln"]:
        why = "dense=false with sepln=true: their blocks after the first have no attention_norm"
    if why:
        raise AuthorsFormatError(f"{name}: {why}; their code cannot run this config")


def probe_config_kwargs(config: dict, name: str = "checkpoint", rope: str = "authors") -> dict:
    """ProbeConfig keyword arguments for their config.json, or AuthorsFormatError naming what does not map."""
    check_rope(rope, name)
    c = settings(config, name)
    kind = c["model_type"]
    pythia = kind == "muddpythia"
    _refuse_what_their_code_cannot_run(c, name)
    L, d, H = int(c["n_layer"]), int(c["dim"]), int(c["n_head"])
    d_head = d // H  # their config's post-init overwrites head_dim
    widths = ffn_widths(int(c["intermediate_size"]), L)
    if min(widths) < 1:
        raise AuthorsFormatError(
            f"{name}: intermediate_size={c['intermediate_size']} gives FFN widths {widths}: their FeedForward cannot "
            "initialise a 0-wide layer; their code cannot run this config"
        )
    kwargs = dict(
        vocab_size=int(c["vocab_size"]),
        n_layers=L,
        d_model=d,
        n_heads=H,
        n_kv_heads=int(c["n_local_heads"]),
        d_head=d_head,
        d_mlp=max(widths),
        d_mlp_layers=widths,
        n_ctx=int(c["block_size"]),
        strict_ctx=True,  # their table and causal mask have block_size rows
        norm_eps=float(c["norm_eps"]),
        rope_theta=float(c["rope_base"]),
        rope_table=AUTHORS_ROPE[kind] if rope == "authors" else "exact",
        qk_norm=bool(c["use_qk_norm"]),
        tie_embeddings=False,  # their tie_weights() does nothing: output is its own matrix even when "tied"
    )
    if c["dense"]:
        kwargs.update(
            dense="mudd",
            mudd_round64=bool(c["round64"]),
            mudd_expand_last=bool(c["expand_last"]),
            dense_stream_norms=True,  # sepln (required above)
        )
    if pythia:
        rot = int(d_head * float(c["rotary_pct"]))
        if rot < 2 or rot % 2:
            raise AuthorsFormatError(
                f"{name}: rotary_pct={c['rotary_pct']!r} gives {rot} rotary coordinates of {d_head}; their rotation "
                "splits an even number >= 2 in halves; their code cannot run this config"
            )
        kwargs.update(
            norm="layer",
            norm_bias=True,
            mlp="gelu",
            linear_bias=True,  # their attention projections always have biases
            mlp_bias=bool(c["use_linear_bias"]),
            parallel_residual=bool(c["use_parallel_residual"]),
            rotary_dims=None if rot == d_head else rot,
        )
    notes = {"tie_word_embeddings": "true: untied (their tie_weights() is a no-op)"} if c["tie_word_embeddings"] else {}
    kwargs["authors_format"] = {
        "format": kind,
        "repository": REPOSITORY,
        "code": CODE_VERSION.format(kind=kind),
        "rope": rope,
        "rope_table": kwargs["rope_table"],
        **({"ignored_keys": c["ignored"]} if c["ignored"] else {}),
        **({"notes": notes} if notes else {}),
    }
    return kwargs


def _find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


def map_state_dict(theirs: dict, config, kind: str, name: str = "checkpoint") -> dict:
    """Their parameter names -> probe's (tensors unchanged); AuthorsFormatError on a missing or leftover name.
    Without dense connections (dense=false) their attention projections are one fused wqkv (or wq/wk/wv, which
    their load hook fuses), and the dense networks their model still builds are never run: not mapped."""
    import torch

    c, pythia, dense = config, kind == "muddpythia", config.dense == "mudd"
    theirs = {k: v for k, v in theirs.items() if not k.endswith(CACHE_BUFFERS)}
    if not dense:
        theirs = {k: v for k, v in theirs.items() if not k.startswith(("dynamic_dense.", "dense_bs."))}
    out, used = {}, set()

    def take(src: str, dst: str):
        if src not in theirs:
            raise AuthorsFormatError(f"{name}: weight {src!r} is missing (a {kind} checkpoint of this config has it)")
        out[dst] = theirs[src]
        used.add(src)

    ln = ("weight", "bias") if pythia else ("weight",)
    bias = ("weight", "bias") if pythia else ("weight",)
    take("tok_embeddings.weight", "embed.weight")
    take("output.weight", "lm_head.weight")
    for p in ln:
        take(f"norm.{p}", f"ln_f.{p}")
    ffn = {"w1": "up", "w2": "down"} if pythia else {"w1": "gate", "w3": "up", "w2": "down"}
    ffn_bias = ("weight", "bias") if c.mlp_bias else ("weight",)
    kv = c.n_kv_heads * c.d_head
    for l in range(c.n_layers):
        a, b = f"layers.{l}.", names.block(l) + "."
        fused = f"{a}attention.wqkv.weight" in theirs and not dense
        for p in bias:
            if fused:
                used.add(f"{a}attention.wqkv.{p}")
                q, k, v = theirs[f"{a}attention.wqkv.{p}"].split([c.n_heads * c.d_head, kv, kv])
                out.update({f"{b}attn.q_proj.{p}": q, f"{b}attn.k_proj.{p}": k, f"{b}attn.v_proj.{p}": v})
            for x in "o" if fused else "qkvo":
                take(f"{a}attention.w{x}.{p}", f"{b}attn.{x}_proj.{p}")
        if c.qk_norm:
            take(f"{a}attention.q_norm.weight", f"{b}attn.q_norm.weight")
            take(f"{a}attention.k_norm.weight", f"{b}attn.k_norm.weight")
        for p in ln:
            if c.dense_stream_norms and l > 0:
                for i, stream in enumerate(("ln1", "ln1_k", "ln1_v")):
                    take(f"{a}attention_norms.{i}.{p}", f"{b}{stream}.{p}")
            else:
                take(f"{a}attention_norm.{p}", f"{b}ln1.{p}")
            take(f"{a}ffn_norm.{p}", f"{b}ln2.{p}")
        for src, dst in ffn.items():
            for p in ffn_bias:
                take(f"{a}feed_forward.{src}.{p}", f"{b}mlp.{dst}.{p}")
        if dense:
            take(f"dynamic_dense.{l}.w1.weight", f"{b}dense.w1.weight")
            take(f"dynamic_dense.{l}.w2.weight", f"{b}dense.w2.weight")
            take(f"dense_bs.{l}", f"{b}dense.bias")
            out[f"{b}dense.norm.weight"] = torch.ones(c.d_model, dtype=theirs[f"dense_bs.{l}"].dtype)  # no gain
    left = sorted(set(theirs) - used)
    if left:
        raise AuthorsFormatError(
            f"{name}: weight {left[0]!r} has no place in probe's model of this config ({len(left)} such)"
        )
    return out


def check_memory(stored_bytes: int, stored_elements: int, dtype, name: str) -> None:
    """Before reading: the weights as stored plus the model in ``dtype`` must fit the memory available (both are
    held while the tensors are mapped and cast); else one line."""
    import torch

    from probe.data.limits import available_memory, human_bytes

    need = stored_bytes + stored_elements * torch.empty((), dtype=dtype).element_size()
    have = available_memory()
    if have is not None and need > have:
        raise AuthorsFormatError(
            f"{name}: reading it needs about {human_bytes(need)}, more than the {human_bytes(have)} of memory available"
        )


def read_weights(folder: Path, name: str) -> dict:
    """Every tensor of a Hugging Face model directory: (sharded) safetensors, else (sharded) pytorch_model.bin read
    with torch.load(weights_only=True) (tensors and plain containers only: nothing is executed)."""
    import torch
    from safetensors.torch import load_file

    from probe.checkpoints.sizes import checked_file, model_file, weight_files

    files = weight_files(folder)
    if files:
        out = {}
        for f in files:
            out.update(load_file(f))
        return out
    index, single = folder / "pytorch_model.bin.index.json", folder / "pytorch_model.bin"
    if os.path.lexists(index):  # each file checked before it is opened: a FIFO would block the read forever
        names = sorted(set(json.loads(checked_file(index, "the shard index").read_text())["weight_map"].values()))
        bins = [model_file(folder, n, "weight file") for n in names]
    else:
        bins = [checked_file(single, "weight file")] if os.path.lexists(single) else []
    if not bins:
        raise AuthorsFormatError(f"{name}: {folder} holds no model.safetensors or pytorch_model.bin")
    out = {}
    for f in bins:
        try:
            out.update(torch.load(f, map_location="cpu", weights_only=True, mmap=True))
        except Exception as e:  # noqa: BLE001 - weights_only refuses anything but tensors and plain containers
            raise AuthorsFormatError(f"{name}: {f.name} cannot be read as weights only ({type(e).__name__})") from None
    return out


def load_tokenizer(folder: Path):
    """The tokenizer beside their weights (tokenizer.json), read by the fast tokenizer class itself: AutoTokenizer
    would consult config.json, whose auto_map asks to run their code. None without a tokenizer.json."""
    if not (Path(folder) / "tokenizer.json").is_file():
        return None
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)


def load_mudd(folder, *, name: str | None = None, dtype=None, rope: str = "authors"):
    """A MUDDFormer / MUDDPythia model directory (their config.json and weights) -> ProbeForCausalLM. ``rope``:
    "authors" rounds the RoPE table as their code does (MUDDFormer bf16, MUDDPythia fp16), "exact" keeps probe's fp32
    table (config.rope_table; config.authors_format records it)."""
    import torch

    from probe.checkpoints.sizes import check_config

    folder = Path(folder)
    name = name or str(folder)
    config = json.loads((folder / "config.json").read_text())
    sizes = {k: v for k, v in config.items() if (k, v) != ("n_local_heads", -1)}  # -1: their "n_head"
    check_config(sizes, name)  # before any size is used: an absurd one is one line, not an allocation
    pc = probe_config(probe_config_kwargs(config, name, rope), name)
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
    from probe.checkpoints.sizes import stored_counts

    n_stored, stored_bytes, files = stored_counts(folder)  # safetensors headers (a .bin: its file size below)
    if not files:
        stored_bytes = sum(f.stat().st_size for f in folder.glob("pytorch_model*.bin"))
        n_stored = stored_bytes // 2  # their released weights are bf16
    check_memory(stored_bytes, n_stored, dtype, name)
    theirs = read_weights(folder, name)
    mapped = map_state_dict(theirs, pc, config["model_type"], name)
    return assemble(pc, mapped, dtype, name, "the config")


def probe_config(kwargs: dict, name: str):
    """ProbeConfig(**kwargs), its own refusals (a width or option probe has no form for) as one AuthorsFormatError."""
    from probe.models.config import ProbeConfig

    try:
        return ProbeConfig(**kwargs)
    except ValueError as e:
        raise AuthorsFormatError(f"{name}: {e}") from None


def assemble(pc, mapped: dict, dtype, name: str, implied_by: str):
    """probe's model of ``pc`` holding the mapped weights (cast to ``dtype``; shapes checked against what
    ``implied_by`` implies, one line on a mismatch), in eval mode (its authors' format is config.authors_format)."""
    import torch

    from probe.models.model import ProbeForCausalLM

    with torch.device("meta"):
        model = ProbeForCausalLM(pc)
    expected = model.state_dict()
    for k, v in mapped.items():
        if tuple(v.shape) != tuple(expected[k].shape):
            raise AuthorsFormatError(
                f"{name}: weight for {k} has shape {tuple(v.shape)}, {implied_by} implies {tuple(expected[k].shape)}"
            )
    model.load_state_dict({k: v.to(dtype) for k, v in mapped.items()}, strict=True, assign=True)
    model.probe_name = name
    return model.eval()
