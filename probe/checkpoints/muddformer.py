"""MUDDFormer's and MUDDPythia's released checkpoints (Caiyun-AI/MUDDFormer) as probe models, without their code.

The authors publish their models in a Hugging Face layout whose config.json names their own modeling code
(``auto_map``, loaded elsewhere with ``trust_remote_code``). Here that config is read as data and mapped onto
ProbeConfig's mechanisms (dense="mudd" with their options; docs/definitions.md#released-checkpoints), and their
state dict onto probe's parameter names; no remote code is imported or run. Anything that cannot be mapped is
refused in one line (:class:`AuthorsFormatError`) naming the key and what probe supports.

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
* QK-norm (use_qk_norm): an RMSNorm with gain over each head, before RoPE; the dense network's RMSNorm has no gain.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from probe.hooks import names

MODEL_TYPES = ("muddformer", "muddpythia")
# config.json keys read (and checked) below; the rest of PretrainedConfig's own keys carry no architecture
ARCHITECTURE_KEYS = {
    "block_size",
    "vocab_size",
    "n_layer",
    "n_head",
    "dim",
    "intermediate_size",
    "n_local_heads",
    "head_dim",
    "rope_base",
    "norm_eps",
    "use_qk_norm",
    "tie_word_embeddings",
    "stack_hidden",
    "dense",
    "dynamic_dense",
    "sepln",
    "dense_type",
    "expand_last",
    "round64",
    "use_parallel_residual",
    "use_linear_bias",
    "rotary_pct",
}
# how their code runs, not what it computes (gradient checkpointing, the decode caches, bf16 training flags)
EXECUTION_KEYS = {"use_gradient_checkpointing", "is_training", "use_layer_cache"}
DATA_KEYS = {
    "auto_map",
    "architectures",
    "model_type",
    "torch_dtype",
    "transformers_version",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "_name_or_path",
}
PYTHIA_ONLY = {"use_parallel_residual", "use_linear_bias", "rotary_pct"}
# their decode-time buffers (setup_caches); a checkpoint saved after setup_caches carries them, they hold no weights
CACHE_BUFFERS = (".kv_cache.k_cache", ".kv_cache.v_cache", "layer_cache.layer_cache")


class AuthorsFormatError(ValueError):
    """An authors' checkpoint that probe cannot map onto its mechanisms; the message is one line."""


def is_mudd_config(config: dict) -> bool:
    return config.get("model_type") in MODEL_TYPES


def _pretrained_defaults() -> set[str]:
    from transformers import PretrainedConfig

    return set(PretrainedConfig().to_dict())


def ffn_widths(intermediate_size: int, n_layer: int) -> list[int]:
    """Their FeedForward's hidden width per layer (scale_with_layer and round128 are always on in their code)."""
    return [round(intermediate_size * (l / (n_layer - 1) + 0.5) / 128) * 128 for l in range(n_layer)]


def probe_config_kwargs(config: dict, name: str = "checkpoint") -> dict:
    """ProbeConfig keyword arguments for their config.json, or AuthorsFormatError naming what does not map."""
    kind = config.get("model_type")
    if kind not in MODEL_TYPES:
        raise AuthorsFormatError(
            f"{name}: model_type={kind!r} is not a MUDD checkpoint; choose one of {', '.join(MODEL_TYPES)}"
        )
    known = ARCHITECTURE_KEYS | EXECUTION_KEYS | DATA_KEYS | _pretrained_defaults()
    unknown = sorted(k for k in config if k not in known or (kind == "muddformer" and k in PYTHIA_ONLY))
    if unknown:
        raise AuthorsFormatError(
            f"{name}: config key {unknown[0]!r} is not one {kind}'s code reads at the pinned "
            "commit; probe cannot tell what it does"
        )

    def want(key, default, allowed):
        value = config.get(key, default)
        if value not in allowed:
            raise AuthorsFormatError(
                f"{name}: {key}={value!r} cannot be mapped onto probe; supported: {', '.join(map(repr, allowed))}"
            )
        return value

    pythia = kind == "muddpythia"
    want("dense", True, (True,))  # without dense connections their forward never mixes: not a MUDD model
    want("dynamic_dense", True, (True,))
    want("dense_type", "qkvr", ("qkvr",))
    want("tie_word_embeddings", False, (False,))  # their tie_weights() does nothing: output is its own matrix
    L, d, H = int(config.get("n_layer", 32)), int(config.get("dim", 2560)), int(config.get("n_head", 32))
    if L < 2:
        raise AuthorsFormatError(f"{name}: n_layer={L} is below 2 (their FFN widths divide by n_layer - 1)")
    if d % H:
        raise AuthorsFormatError(f"{name}: dim={d} is not a multiple of n_head={H}")
    kv = int(config.get("n_local_heads", -1))
    kv = H if kv == -1 else kv
    d_head = d // H  # their post-init overwrites head_dim
    inter = config.get("intermediate_size")
    if inter is None:
        inter = 4 * d if pythia else _find_multiple(int(2 * 4 * d / 3), 256)
    widths = ffn_widths(int(inter), L)
    kwargs = dict(
        vocab_size=int(config.get("vocab_size", 32000 if pythia else 50432)),
        n_layers=L,
        d_model=d,
        n_heads=H,
        n_kv_heads=kv,
        d_head=d_head,
        d_mlp=max(widths),
        d_mlp_layers=widths,
        n_ctx=int(config.get("block_size", 2048)),
        norm_eps=float(config.get("norm_eps", 1e-5 if pythia else 1e-6)),
        rope_theta=float(config.get("rope_base", 10000)),
        qk_norm=bool(config.get("use_qk_norm", False)),
        tie_embeddings=False,
        dense="mudd",
        mudd_round64=bool(config.get("round64", False)),
        mudd_expand_last=bool(config.get("expand_last", False)),
        dense_stream_norms=bool(config.get("sepln", True)),
    )
    if pythia:
        want("use_linear_bias", True, (True,))  # their attention projections always have biases; probe's one flag
        rot = int(d_head * float(config.get("rotary_pct", 0.25)))
        if rot < 2 or rot % 2:
            raise AuthorsFormatError(
                f"{name}: rotary_pct={config.get('rotary_pct')!r} gives {rot} rotary "
                f"coordinates of {d_head}; probe needs an even number >= 2"
            )
        kwargs.update(
            norm="layer",
            norm_bias=True,
            mlp="gelu",
            linear_bias=True,
            parallel_residual=bool(config.get("use_parallel_residual", True)),
            rotary_dims=None if rot == d_head else rot,
        )
    return kwargs


def _find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


def map_state_dict(theirs: dict, config, kind: str, name: str = "checkpoint") -> dict:
    """Their parameter names -> probe's (tensors unchanged); AuthorsFormatError on a missing or leftover name."""
    import torch

    c, pythia = config, kind == "muddpythia"
    theirs = {k: v for k, v in theirs.items() if not k.endswith(CACHE_BUFFERS)}
    out, used = {}, set()

    def take(src: str, dst: str):
        if src not in theirs:
            raise AuthorsFormatError(f"{name}: weight {src!r} is missing (a {kind} checkpoint of this config has it)")
        out[dst] = theirs[src]
        used.add(src)

    ln = ("weight", "bias") if pythia else ("weight",)
    take("tok_embeddings.weight", "embed.weight")
    take("output.weight", "lm_head.weight")
    for p in ln:
        take(f"norm.{p}", f"ln_f.{p}")
    ffn = {"w1": "up", "w2": "down"} if pythia else {"w1": "gate", "w3": "up", "w2": "down"}
    for l in range(c.n_layers):
        a, b = f"layers.{l}.", names.block(l) + "."
        for x in "qkvo":
            for p in ("weight", "bias") if pythia else ("weight",):
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
            for p in ("weight", "bias") if pythia else ("weight",):
                take(f"{a}feed_forward.{src}.{p}", f"{b}mlp.{dst}.{p}")
        take(f"dynamic_dense.{l}.w1.weight", f"{b}dense.w1.weight")
        take(f"dynamic_dense.{l}.w2.weight", f"{b}dense.w2.weight")
        take(f"dense_bs.{l}", f"{b}dense.bias")
        out[f"{b}dense.norm.weight"] = torch.ones(c.d_model, dtype=theirs[f"dense_bs.{l}"].dtype)  # theirs: no gain
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


def load_mudd(folder, *, name: str | None = None, dtype=None):
    """A MUDDFormer / MUDDPythia model directory (their config.json and weights) -> ProbeForCausalLM."""
    import torch

    from probe.checkpoints.sizes import check_config
    from probe.models.config import ProbeConfig

    folder = Path(folder)
    name = name or str(folder)
    config = json.loads((folder / "config.json").read_text())
    check_config(config, name)  # before any size is used: an absurd one is one line, not an allocation
    kwargs = probe_config_kwargs(config, name)
    pc = ProbeConfig(**kwargs)
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
    from probe.checkpoints.sizes import stored_counts

    n_stored, stored_bytes, files = stored_counts(folder)  # safetensors headers (a .bin: its file size below)
    if not files:
        stored_bytes = sum(f.stat().st_size for f in folder.glob("pytorch_model*.bin"))
        n_stored = stored_bytes // 2  # their released weights are bf16
    check_memory(stored_bytes, n_stored, dtype, name)
    theirs = read_weights(folder, name)
    mapped = map_state_dict(theirs, pc, config["model_type"], name)
    return assemble(
        pc, mapped, dtype, name, "the config", {"format": config["model_type"], "repository": "Caiyun-AI/MUDDFormer"}
    )


def assemble(pc, mapped: dict, dtype, name: str, implied_by: str, authors_format: dict):
    """probe's model of ``pc`` holding the mapped weights (cast to ``dtype``; shapes checked against what
    ``implied_by`` implies, one line on a mismatch), in eval mode, its authors' format recorded."""
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
    model.authors_format = {**authors_format, "n_params": sum(p.numel() for p in model.parameters())}
    return model.eval()
