"""Tiny checkpoints in LR-AttnRes's released format (jon123boss/LR-AttnRes), with golden outputs of their model.

    git -C <mirror> archive <commit> model.py attnres_ops.py optimizer.py schedulers.py muon | tar -x -C /tmp/lr
    /tmp/authors-venv/bin/python scripts/authors/lr_attnres_checkpoints.py --src /tmp/lr --commit <commit> \
        [--kinds block,full,baseline] [--save-dtype bfloat16] [--tag]

Their released models (Jonnester/LR-AttnRes-*) are training checkpoints: ``train.py``'s ``build_checkpoint`` dict
(``step``, ``tokens_processed``, ``model`` = the unwrapped ``OBPM.state_dict()``, ``muon_optimizer``,
``adamw_optimizer``, ``muon_scheduler``, ``adamw_scheduler``, ``config`` = the primitive-valued training globals,
``model_args`` = ``asdict(ModelConfig)``) written by ``torch.save``; ``full_run`` uploads it as ``final_model.pt``
(``upload_full_run_checkpoint``) and their loaders (``load_jonnester_model_to_out.py``) read that dict back.

This script builds their OBPM with train.py's model defaults (LR-AttnRes: ``--use_lrid``; block with their block
mean and log-count prior, or full) at a tiny size, draws seeded random weights (queries included), takes one
optimizer step with their own optimizers and schedulers (optimizer.py, schedulers.py, muon/) so those entries are
theirs too, saves the dict exactly as build_checkpoint lays it out, and runs their forward on the saved state dict
(weights and their RoPE buffers) in fp64, fp32 and bf16. ``--save-dtype bfloat16`` trains and saves as their CUDA
runs do (``to_mixed_precision(torch.bfloat16)`` before the step: weights and RoPE buffers stored in bf16). At a commit
whose ModelConfig lacks a field of the settings below, the field is dropped (its train.py could not set it).
Writes tests/fixtures/authors/lr-attnres-<kind>-checkpoint/ (``--tag``: lr-attnres-<commit>-<kind>-checkpoint/) with
final_model.pt, inputs, outputs and meta.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys

import torch
from common import (
    FIXTURES,
    FP64_CONSTANTS_PATCH,
    KEEP_FP64_PATCH,
    fp64_constants,
    git_blob_sha1,
    keep_fp64_through_float,
    load_module,
    randomize,
    source_parser,
    versions,
)
from safetensors.torch import save_file

REPOSITORY = "jon123boss/LR-AttnRes"
FILE = "model.py"
# train.py's model defaults (its "# model", "# Attention Residuals", "# rope", "# normalization" sections) with
# --use_lrid, then only the sizes made tiny; flash_attention off (CPU; the same attention function)
TRAIN_DEFAULTS = dict(
    mlp_ratio=None,
    weight_tying=False,
    init_std=0.02,
    init_cutoff_factor=None,
    use_attnres=False,
    use_fused_attnres=False,
    attnres_type="block",
    attnres_num_blocks=8,
    attnres_block_average=True,
    attnres_block_average_mode="count",
    attnres_block_count_prior=True,
    attnres_block_alpha="legacy",
    attnres_block_beta="legacy",
    attnres_block_alpha_learned=False,
    attnres_block_beta_learned=False,
    attnres_block_alpha_scope="shared",
    attnres_block_beta_scope="shared",
    attnres_block_split_sublayers=False,
    attnres_block_learned_scale=False,
    attnres_block_learned_scale_init="count",
    attnres_block_value_norm=False,
    attnres_key_norm=True,
    attn_res_query_norm=False,
    attn_res_query_init="zero",
    attnres_training_cache_phase1=True,
    attnres_training_torch_phase2=True,
    attnres_fuse_read_norm=True,
    use_lrid=True,
    lrid_rank=32,
    lrid_projection_rank=None,
    lrid_num_heads=1,
    lrid_input_dependent_query=False,
    lrid_static_embedding_key=False,
    lrid_add_static_embedding_key=False,
    lrid_add_static_source_key=False,
    lrid_key_from_value=False,
    lrid_key_from_value_shared=False,
    lrid_key_from_output_tail=False,
    lrid_key_value_norm=True,
    lrid_query_from_value=False,
    lrid_query_from_value_shared=False,
    lrid_use_logit_scale=False,
    lrid_logit_scale=None,
    rope_theta=500000.0,
    qk_norm=True,
    norm_pos="before",
    clip_qkv=None,
    flash_attention=False,
)
TINY = dict(block_size=16, vocab_size=48, n_layer=3, n_head=2, n_embd=16, mlp_hidden_dim=24, lrid_rank=4)
KINDS = {  # fixture -> the released run it stands for
    "block": dict(attnres_type="block", attnres_num_blocks=3),  # Jonnester/LR-AttnRes-n8-Avg's recipe at 2L = 6
    "full": dict(attnres_type="full"),  # Jonnester/LR-AttnRes-Full's
    "baseline": dict(use_lrid=False, use_attnres=False),  # train.py's own default: the residual baseline
}
# train.py's optimiser / schedule defaults (get_optimizers and get_schedulers read these keys of `config`)
TRAIN_CONFIG = dict(
    muon_lr=0.001,
    adamw_lr=0.0003,
    muon_weight_decay=0.1,
    adamw_weight_decay=0.0,
    cautious=True,
    beta1=0.9,
    beta2=0.95,
    muon_momentum=0.95,
    warmup_steps=2000,
    max_steps=38146,
    warmdown_steps=int(0.2 * 38146),
    sched_mode="linear",
    batch_size=16,
    block_size=2048,
    grad_accum_steps=8,
    z_loss=True,
    master_process=True,
)
SEED, BATCH, T = 0, 2, 8


def run(mod, settings: dict, saved: dict, ids: torch.Tensor, dtype) -> dict:
    """Their forward of the saved state dict (weights and RoPE buffers: their tables) in ``dtype``."""
    model = mod.OBPM(mod.ModelConfig(**settings)).to(dtype).eval()
    model.load_state_dict({k: v.to(dtype) for k, v in saved.items()}, strict=True)
    patches = (keep_fp64_through_float(), fp64_constants()) if dtype == torch.float64 else ()
    with torch.no_grad(), contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        logits = model(ids)
    return {"logits": logits.to(torch.float64 if dtype == torch.float64 else torch.float32)}


def checkpoint_payload(src, mod, model, settings: dict) -> dict:
    """build_checkpoint's dict for ``model`` after one step of their optimisers (train.py's defaults)."""
    sys.path.insert(0, str(src))
    optimizer = load_module(src / "optimizer.py", "lr_attnres_optimizer")
    schedulers = load_module(src / "schedulers.py", "lr_attnres_schedulers")
    config = {
        **TRAIN_CONFIG,
        **{k: v for k, v in settings.items() if isinstance(v, (int, float, bool, str, type(None)))},
    }
    cfg = {**config, "block_size": settings["block_size"]}
    muon, adamw = optimizer.get_optimizers(cfg, model)
    muon_s, adamw_s = schedulers.get_schedulers(cfg, muon, adamw)
    ids = torch.randint(0, settings["vocab_size"], (BATCH, T + 1), generator=torch.Generator().manual_seed(SEED + 2))
    logits = model.float()(ids[:, :-1])
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
    for o in (muon, adamw):
        o.step()
        o.zero_grad(set_to_none=True)
    for s in (muon_s, adamw_s):
        s.step()
    return {
        "step": 1,
        "tokens_processed": BATCH * T,
        "model": model.state_dict(),
        "muon_optimizer": muon.state_dict(),
        "adamw_optimizer": adamw.state_dict(),
        "muon_scheduler": muon_s.state_dict(),
        "adamw_scheduler": adamw_s.state_dict(),
        "config": config,
        "model_args": dataclasses.asdict(model.config),
    }


def main(argv=None) -> int:
    ap = source_parser(__doc__, "folder holding their model.py, attnres_ops.py, optimizer.py, schedulers.py, muon/")
    ap.add_argument("--kinds", default=",".join(KINDS), help="which of " + ", ".join(KINDS))
    ap.add_argument("--save-dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--tag", action="store_true", help="name the fixtures lr-attnres-<commit>-<kind>-checkpoint")
    args = ap.parse_args(argv)
    mod = load_module(args.src / FILE, f"lr_attnres_model_{args.commit[:7]}")
    fields = {f.name for f in dataclasses.fields(mod.ModelConfig)}
    save_dtype = getattr(torch, args.save_dtype)
    for kind in args.kinds.split(","):
        wanted = {**TRAIN_DEFAULTS, **TINY, **KINDS[kind]}
        settings = {k: v for k, v in wanted.items() if k in fields}
        model = mod.OBPM(mod.ModelConfig(**settings)).double()
        randomize(model, SEED)
        weights = {k: v.clone() for k, v in model.state_dict().items() if not k.endswith((".sin", ".cos"))}
        ids = torch.randint(0, settings["vocab_size"], (BATCH, T), generator=torch.Generator().manual_seed(SEED + 1))

        # the saved checkpoint: their model (fp32, or bf16 as to_mixed_precision makes it) after one training step
        # of their optimisers; the golden outputs are of the state dict as saved (fp64, fp32 and bf16 runs of it)
        trained = mod.OBPM(mod.ModelConfig(**settings)).float()
        trained.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
        if save_dtype != torch.float32:
            trained.to_mixed_precision(dtype=save_dtype)
        torch.manual_seed(SEED)
        payload = checkpoint_payload(args.src, mod, trained, settings)
        saved = {k: v.clone() for k, v in payload["model"].items()}
        outputs = {}
        for dtype, prefix in ((torch.float64, ""), (torch.float32, "fp32/"), (torch.bfloat16, "bf16/")):
            outputs.update({f"{prefix}{k}": v for k, v in run(mod, settings, saved, ids, dtype).items()})

        out = FIXTURES / (
            f"lr-attnres-{args.commit[:7]}-{kind}-checkpoint" if args.tag else f"lr-attnres-{kind}-checkpoint"
        )
        out.mkdir(parents=True, exist_ok=True)
        torch.save(payload, out / "final_model.pt")
        save_file({"input_ids": ids.contiguous()}, out / "inputs.safetensors")
        save_file({k: v.contiguous() for k, v in outputs.items()}, out / "outputs.safetensors")
        meta = {
            "repository": REPOSITORY,
            "commit": args.commit,
            "file": FILE,
            "file_blob_sha1": git_blob_sha1(args.src / FILE),
            "also_imported": {
                f: git_blob_sha1(args.src / f)
                for f in ("attnres_ops.py", "optimizer.py", "schedulers.py", "muon/muon.py")
                if (args.src / f).is_file()
            },
            "format_from": "train.py build_checkpoint / save_training_checkpoint (torch.save) and "
            "upload_full_run_checkpoint (path_in_repo='final_model.pt')",
            "entry": "OBPM(ModelConfig(**settings)).eval()(input_ids) (their plain, unfused forward)",
            "settings": settings,
            "dropped": sorted(set(wanted) - fields),
            "model_args": payload["model_args"],
            "saved_dtype": args.save_dtype,
            "seed": SEED,
            "inputs": {"shape": [BATCH, T]},
            "payload_keys": sorted(payload),
            "parameter_names": {k: list(v.shape) for k, v in payload["model"].items()},
            "weights": f"every parameter N(0, 1/fan-in) (1-d: N(0, 1)) in fp64 from torch.Generator seed {SEED} "
            "in their parameter order (queries included), cast to fp32"
            + (f" then to {args.save_dtype} by their to_mixed_precision" if save_dtype != torch.float32 else "")
            + ", then one step of their Muon + AdamW on one random batch (seed 2) with train.py's optimiser defaults",
            "outputs": {
                "logits": "B,T,V of the saved state dict, their tables included (their fp64 run of it)",
                "fp32/": "the same state dict run in fp32",
                "bf16/": "the same state dict cast to bf16 and run in bf16 (their training dtype); stored as fp32",
            },
            "patches": [KEEP_FP64_PATCH, FP64_CONSTANTS_PATCH],
            "versions": versions("einops"),
            "script": "scripts/authors/lr_attnres_checkpoints.py",
        }
        (out / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
