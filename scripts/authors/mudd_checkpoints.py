"""Tiny checkpoints in MUDDFormer's released Hugging Face format, with golden outputs of the authors' own code.

    git -C <mirror> archive <commit> pytorch/muddformer pytorch/muddpythia | tar -x -C /tmp/muddformer
    /tmp/authors-venv/bin/python scripts/authors/mudd_checkpoints.py --src /tmp/muddformer/pytorch --commit <commit>

For each released family (MUDDFormer: ``pytorch/muddformer``; MUDDPythia: ``pytorch/muddpythia``) this builds their
model class from their released config.json (``config.json``; ``config_1p4b.json``) with only the sizes made tiny,
every released option kept (round64, expand_last, sepln, QK-norm, per-layer FFN widths; MUDDPythia's parallel
residual, linear biases, LayerNorms and rotary_pct), draws seeded random weights (norm gains and biases included, so
a wrong stream norm or bias moves the outputs), and writes ``tests/fixtures/authors/<family>-checkpoint/``:

    checkpoint/config.json, checkpoint/model.safetensors   their format: save_pretrained's files, with the released
                                                            config's ``auto_map`` / ``architectures`` (read as data)
    inputs.safetensors, outputs.safetensors, meta.json     input ids; logits and dense weights (fp64, and fp32/)

It also records, for each released config at full size, the shapes their code gives the dense-connection networks
and FFNs (built on the meta device), so probe's options are checked at the real sizes too.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from common import (
    FIXTURES,
    KEEP_FP64_CASTS_PATCH,
    KEEP_FP64_PATCH,
    git_blob_sha1,
    keep_fp64_through_float,
    keep_fp64_through_fp32_casts,
    load_module,
    randomize,
    source_parser,
    versions,
)
from safetensors.torch import save_file

REPOSITORY = "Caiyun-AI/MUDDFormer"
FAMILIES = {  # fixture -> (folder, module, config module, class, config class, released config files)
    "muddformer": (
        "muddformer",
        "modeling_muddformer",
        "configuration_muddformer",
        "MUDDFormer",
        "MUDDFormerConfig",
        ["config.json"],
    ),
    "muddpythia": (
        "muddpythia",
        "modeling_muddpythia",
        "configuration_muddpythia",
        "MUDDPythia",
        "MUDDPythiaConfig",
        ["config_1p4b.json", "config_2p8b.json"],
    ),
}
# only the sizes change from the released config; intermediate_size 200 over 3 layers gives their per-layer
# widths round(200 * (l / 2 + 0.5) / 128) * 128 = 128, 256, 256
TINY = dict(
    block_size=16,
    vocab_size=48,
    n_layer=3,
    n_head=2,
    n_local_heads=2,
    dim=16,
    head_dim=8,
    intermediate_size=200,
    torch_dtype="float64",
)
SEED, BATCH, T = 0, 2, 8


def build(mod, cfg_cls, model_cls, config: dict, dtype):
    cfg = cfg_cls(**config)
    model = model_cls(cfg).to(dtype).eval()
    model.setup_caches(max_batch_size=BATCH, max_seq_length=cfg.block_size, dtype=dtype)
    return model


@torch.no_grad()
def random_weights(model) -> None:
    """Matrices N(0, 1/fan-in), dense_bs N(0, 1/L) (common.randomize); norm gains 1 + 0.3 N(0, 1) and every bias
    0.3 N(0, 1) from a second seeded generator, so each of the q/k/v stream norms differs."""
    gains_and_biases = {n for n, p in model.named_parameters() if "norm" in n or n.endswith(".bias")}
    randomize(model, SEED, skip=gains_and_biases)
    g = torch.Generator().manual_seed(SEED + 7)
    for n, p in model.named_parameters():
        if n in gains_and_biases:
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3
            p.copy_(noise + (0.0 if n.endswith(".bias") else 1.0))


@contextlib.contextmanager
def recording_dense(model, record: dict):
    originals = [blk.layer_mix for blk in model.dynamic_dense]
    for l, blk in enumerate(model.dynamic_dense):

        def layer_mix(hids, dw, _l=l, _orig=originals[l]):
            record[f"dense_weights.{_l}"] = dw  # C,B,T,L
            return _orig(hids, dw)

        blk.layer_mix = layer_mix
    try:
        yield
    finally:
        for blk in model.dynamic_dense:
            del blk.layer_mix


def run(model, ids, dtype) -> dict:
    record: dict = {}
    patches = (keep_fp64_through_fp32_casts(), keep_fp64_through_float()) if dtype == torch.float64 else ()
    with torch.no_grad(), contextlib.ExitStack() as stack, recording_dense(model, record):
        for patch in patches:
            stack.enter_context(patch)
        record["logits"] = model(ids, return_tensor=True)
    record["tables/rope"] = model.freqs_cis  # block_size, rotary dims / 2, (cos, sin): bf16 / fp16 as they make it
    return {k: v.to(dtype if dtype != torch.bfloat16 else torch.float32) for k, v in record.items()}


def released_shapes(mod, cfg_cls, model_cls, config: dict) -> dict:
    """Per layer at full size: their dense network's w1 / w2 shapes and FFN width (meta device: no memory)."""
    with torch.device("meta"):
        m = model_cls(cfg_cls(**config))
    return {
        "dense_w1": [list(b.w1.weight.shape) for b in m.dynamic_dense],
        "dense_w2": [list(b.w2.weight.shape) for b in m.dynamic_dense],
        "ffn_widths": [blk.feed_forward.w1.out_features for blk in m.layers],
    }


def write_family(name: str, src: Path, commit: str) -> Path:
    folder, mod_name, cfg_name, cls_name, cfg_cls_name, released = FAMILIES[name]
    cfg_mod = load_module(src / folder / f"{cfg_name}.py", cfg_name)
    mod = load_module(src / folder / f"{mod_name}.py", mod_name)
    cfg_cls, model_cls = getattr(cfg_mod, cfg_cls_name), getattr(mod, cls_name)
    released_cfg = json.loads((src / folder / released[0]).read_text())
    config = {k: v for k, v in released_cfg.items() if k not in ("architectures", "auto_map", "transformers_version")}
    config.update(TINY)

    model = build(mod, cfg_cls, model_cls, config, torch.float64)
    random_weights(model)
    ids = torch.randint(0, TINY["vocab_size"], (BATCH, T), generator=torch.Generator().manual_seed(SEED + 1))
    outputs = run(model, ids, torch.float64)
    for dtype, prefix in ((torch.float32, "fp32/"), (torch.bfloat16, "bf16/")):
        other = build(mod, cfg_cls, model_cls, config, dtype)
        other.load_state_dict({k: v.to(dtype) for k, v in model.state_dict().items()}, strict=True)
        outputs.update(
            {f"{prefix}{k}": v for k, v in run(other, ids, dtype).items() if k == "logits" or prefix == "fp32/"}
        )

    out = FIXTURES / f"{name}-checkpoint"
    ckpt = out / "checkpoint"
    ckpt.mkdir(parents=True, exist_ok=True)
    # saved as a released model is: built, weights loaded, no inference caches set up (their KV / layer caches are
    # buffers that setup_caches adds)
    plain = model_cls(cfg_cls(**config)).to(torch.float64)
    params = dict(model.named_parameters())
    plain.load_state_dict({k: params[k] for k, _ in plain.state_dict().items()}, strict=True)
    plain.save_pretrained(ckpt, safe_serialization=True)  # HF's writer: model.safetensors + config.json
    saved = json.loads((ckpt / "config.json").read_text())
    saved.update({"architectures": released_cfg["architectures"], "auto_map": released_cfg["auto_map"]})
    (ckpt / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    save_file({"input_ids": ids.contiguous()}, out / "inputs.safetensors")
    save_file({k: v.detach().contiguous() for k, v in outputs.items()}, out / "outputs.safetensors")

    full = {
        f: released_shapes(
            mod,
            cfg_cls,
            model_cls,
            {
                k: v
                for k, v in json.loads((src / folder / f).read_text()).items()
                if k not in ("architectures", "auto_map", "transformers_version")
            },
        )
        for f in released
    }
    meta = {
        "repository": REPOSITORY,
        "commit": commit,
        "file": f"pytorch/{folder}/{mod_name}.py",
        "file_blob_sha1": git_blob_sha1(src / folder / f"{mod_name}.py"),
        "also_imported": {f"pytorch/{folder}/{cfg_name}.py": git_blob_sha1(src / folder / f"{cfg_name}.py")},
        "released_configs": {f"pytorch/{folder}/{f}": git_blob_sha1(src / folder / f) for f in released},
        "released_config_contents": {f: json.loads((src / folder / f).read_text()) for f in released},
        "config_from": f"pytorch/{folder}/{released[0]} with only these keys changed: {sorted(TINY)}",
        "entry": f"m = {cls_name}({cfg_cls_name}(**config)).eval(); m.setup_caches(B, block_size, dtype); "
        "m(input_ids, return_tensor=True); m.save_pretrained(dir, safe_serialization=True)",
        "tiny": TINY,
        "seed": SEED,
        "inputs": {"shape": [BATCH, T]},
        "tiny_shapes": released_shapes(mod, cfg_cls, model_cls, config),
        "released_shapes": full,
        "parameter_names": {k: list(v.shape) for k, v in plain.state_dict().items()},
        "weights": f"matrices N(0, 1/fan-in) (1-d: N(0, 1)) in fp64 from torch.Generator seed {SEED} in their "
        f"parameter order, except norm gains 1 + 0.3 N(0, 1) and biases 0.3 N(0, 1) (seed {SEED + 7})",
        "outputs": {
            "logits": "B,T,V",
            "dense_weights.{l}": "C,B,T,L after layer l (dynamic + dense_bs)",
            "tables/rope": "their RoPE table (block_size, rotary dims / 2, cos|sin) as their code makes and uses it: "
            "torch.polar of fp32 angles, rounded to bf16 (MUDDFormer) / fp16 (MUDDPythia); stored at the run's dtype",
            "fp32/": "the same weights run in fp32",
            "bf16/logits": "the same weights cast to bf16 and run in bf16 (setup_caches(dtype=bf16)); stored as fp32",
        },
        "patches": [
            KEEP_FP64_CASTS_PATCH,
            KEEP_FP64_PATCH,
        ],
        "rope": "their own RoPE table in every run (precompute_freqs_cis's bf16 / fp16 cast kept: the model as "
        "shipped)",
        "checkpoint_files": "save_pretrained's model.safetensors and config.json (transformers as in versions); "
        "config.json gets the released config's architectures and auto_map keys",
        "versions": versions("einops", "transformers"),
        "script": "scripts/authors/mudd_checkpoints.py",
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return out


def main(argv=None) -> int:
    ap = source_parser(__doc__, "their pytorch folder (muddformer/ and muddpythia/ inside)")
    args = ap.parse_args(argv)
    for name in FAMILIES:
        print(write_family(name, args.src, args.commit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
