"""Which MUDDFormer / MUDDPythia configs their code runs, and what it computes on those it does.

    git -C <mirror> archive <commit> pytorch/muddformer pytorch/muddpythia | tar -x -C /tmp/muddformer
    /tmp/authors-venv/bin/python scripts/authors/mudd_configs.py --src /tmp/muddformer/pytorch --commit <commit>

For each family a tiny base config (their released config.json, sizes made tiny) and variants of it, each one key
of their config class changed (or a key their class does not define, or a sequence past block_size): their model is
built from their config class, given seeded random weights (rounded to bf16, their released dtype), and run in fp64.
A variant their code cannot build or run records the error; one it runs records its config.json and logits, and its
weights (save_pretrained's model.safetensors in bf16) unless an earlier variant has the same parameter names and
shapes (then the same seeded weights: ``weights_from`` names it). Their config
classes' fields and defaults (inspect.signature of __init__) are recorded too. Writes
tests/fixtures/authors/mudd-configs/ (meta.json, inputs / outputs.safetensors, checkpoints/<family>-<variant>/);
tests/checkpoints/test_authors_configs.py loads each through probe.
"""

from __future__ import annotations

import contextlib
import inspect
import json

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
from mudd_checkpoints import FAMILIES, REPOSITORY
from safetensors.torch import save_file

TINY = dict(block_size=8, vocab_size=32, n_layer=2, n_head=2, n_local_heads=2, dim=8, intermediate_size=192, head_dim=4)
PYTHIA_TINY = {**TINY, "rotary_pct": 0.5}  # head_dim 4: 2 rotary coordinates (their 0.25 would give 1)
VARIANTS = {  # family -> variant -> the keys changed from the tiny base ("T": the sequence length run instead)
    "muddformer": {
        "base": {},
        "tie_word_embeddings": {"tie_word_embeddings": True},
        "dense_false": {"dense": False, "sepln": False},
        "dense_false_static": {"dense": False, "sepln": False, "dynamic_dense": False},
        "dense_false_stack_hidden": {"dense": False, "sepln": False, "stack_hidden": True},
        "dense_false_sepln": {"dense": False},
        "stack_hidden": {"stack_hidden": True},
        "sepln_false": {"sepln": False},
        "dynamic_dense_false": {"dynamic_dense": False},
        "dense_type_l": {"dense_type": "l"},
        "mqa": {"n_local_heads": 1},
        "gqa": {"n_head": 4, "n_local_heads": 2},
        "one_layer": {"n_layer": 1},
        "use_cache": {"use_cache": True},
        "pythia_key": {"use_parallel_residual": False},
        "past_block_size": {"T": TINY["block_size"] + 1},
        "zero_width_ffn": {"intermediate_size": 128},
    },
    "muddpythia": {
        "base": {},
        "use_linear_bias_false": {"use_linear_bias": False},
        "dense_false": {"dense": False, "sepln": False},
        "serial_residual": {"use_parallel_residual": False},
        "rotary_full": {"rotary_pct": 1.0},
        "rotary_odd": {"rotary_pct": 0.75},
        "rotary_none": {"rotary_pct": 0.1},
        "gqa": {"n_head": 4, "dim": 16, "n_local_heads": 2},
        "past_block_size": {"T": TINY["block_size"] + 1},
    },
}
SEED, T = 0, TINY["block_size"]


def their_model(cfg_cls, model_cls, config: dict):
    model = model_cls(cfg_cls(**config)).to(torch.float64).eval()
    randomize(model, SEED)
    with torch.no_grad():  # their released weights are bf16: the fixture's are bf16-exact
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float64))
    return model


def run(model, ids) -> torch.Tensor:
    model.setup_caches(max_batch_size=ids.shape[0], max_seq_length=model.config.block_size, dtype=torch.float64)
    with torch.no_grad(), keep_fp64_through_fp32_casts(), keep_fp64_through_float():
        return model(ids, return_tensor=True)


def variant(cfg_cls, model_cls, config: dict, T_run: int) -> dict:
    """{"logits", "model"} or {"error"}: their code building and running ``config`` on T_run tokens."""
    ids = torch.randint(0, config["vocab_size"], (1, T_run), generator=torch.Generator().manual_seed(SEED + 1))
    try:
        model = their_model(cfg_cls, model_cls, config)
        return {"logits": run(model, ids), "model": model}
    except Exception as e:  # noqa: BLE001 - their code failing on this config is the answer recorded
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}


def main(argv=None) -> int:
    ap = source_parser(__doc__, "their pytorch folder (muddformer/ and muddpythia/ inside)")
    args = ap.parse_args(argv)
    out = FIXTURES / "mudd-configs"
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    meta = {"repository": REPOSITORY, "commit": args.commit, "families": {}, "variants": {}}
    outputs = {}
    for family, edits in VARIANTS.items():
        folder, mod_name, cfg_name, cls_name, cfg_cls_name, released = FAMILIES[family]
        cfg_mod = load_module(args.src / folder / f"{cfg_name}.py", cfg_name)
        mod = load_module(args.src / folder / f"{mod_name}.py", mod_name)
        cfg_cls, model_cls = getattr(cfg_mod, cfg_cls_name), getattr(mod, cls_name)
        released_cfg = json.loads((args.src / folder / released[0]).read_text())
        base = {k: v for k, v in released_cfg.items() if k not in ("architectures", "auto_map", "transformers_version")}
        base.update(PYTHIA_TINY if family == "muddpythia" else TINY)
        fields = {
            name: (None if p.default is inspect.Parameter.empty else p.default)
            for name, p in inspect.signature(cfg_cls.__init__).parameters.items()
            if name not in ("self", "kwargs")
        }
        meta["families"][family] = {
            "config_class": f"pytorch/{folder}/{cfg_name}.py {cfg_cls_name}",
            "fields": fields,  # their config class's __init__ keywords and defaults
            "modeling_blob_sha1": git_blob_sha1(args.src / folder / f"{mod_name}.py"),
            "config_blob_sha1": git_blob_sha1(args.src / folder / f"{cfg_name}.py"),
            "released_config": released[0],
            "base": base,
        }
        stored = {}  # parameter names and shapes -> the variant whose checkpoint holds those weights
        for name, edit in edits.items():
            key, T_run = f"{family}-{name}", edit.get("T", T)
            config = {**base, **{k: v for k, v in edit.items() if k != "T"}}
            result = variant(cfg_cls, model_cls, config, T_run)
            record = {"family": family, "edit": edit, "T": T_run}
            if "error" in result:
                meta["variants"][key] = {**record, "runs": False, "error": result["error"]}
                print(key, "fails:", result["error"][:100], flush=True)
                continue
            model = result["model"]
            params = json.dumps({k: list(v.shape) for k, v in model.state_dict().items() if "cache" not in k})
            weights_from = stored.setdefault(params, key)  # the same names and shapes: the same seeded weights
            ckpt = out / "checkpoints" / key
            ckpt.mkdir(parents=True, exist_ok=True)
            plain = model_cls(cfg_cls(**config)).to(torch.bfloat16)  # as released: bf16, no inference caches
            state = {k: v for k, v in model.state_dict().items() if k in dict(plain.state_dict())}
            plain.load_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()}, strict=True)
            with contextlib.redirect_stdout(None):
                plain.save_pretrained(ckpt, safe_serialization=True)
            saved = json.loads((ckpt / "config.json").read_text())
            saved.update({"architectures": released_cfg["architectures"], "auto_map": released_cfg["auto_map"]})
            (ckpt / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
            if weights_from != key:  # an earlier variant's weights serve (the test copies them beside config.json)
                (ckpt / "model.safetensors").unlink()
            outputs[key] = result["logits"].contiguous()
            same = next(
                (
                    k
                    for k, v in outputs.items()
                    if k != key and v.shape == outputs[key].shape and torch.equal(v, outputs[key])
                ),
                None,
            )
            meta["variants"][key] = {
                **record,
                "runs": True,
                "weights_from": weights_from,
                **({"same_logits_as": same} if same else {}),
            }
            print(key, "runs, weights of", weights_from, f"= {same}" if same else "", flush=True)
    ids = {
        f"T{n}": torch.randint(0, TINY["vocab_size"], (1, n), generator=torch.Generator().manual_seed(SEED + 1))
        for n in (T, T + 1)
    }
    save_file(ids, out / "inputs.safetensors")
    save_file(outputs, out / "outputs.safetensors")
    meta.update(
        {
            "seed": SEED,
            "inputs": "T8 / T9: (1, T) token ids, torch.Generator seed 1 (the variant's T picks one)",
            "weights": f"randomize(model, {SEED}) (N(0, 1/fan-in), 1-d N(0, 1), their parameter order), rounded to "
            "bf16; checkpoints/<family>-<variant>/ is save_pretrained's config.json (with the released auto_map) and, "
            "model.safetensors (bf16) unless weights_from names an earlier variant with the same parameters",
            "outputs": "<family>-<variant>: (1, T, V) fp64 logits of their model (setup_caches(dtype=fp64); their "
            "own RoPE table, bf16 / fp16)",
            "patches": [KEEP_FP64_CASTS_PATCH, KEEP_FP64_PATCH],
            "versions": versions("einops", "transformers"),
            "script": "scripts/authors/mudd_configs.py",
        }
    )
    (out / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
