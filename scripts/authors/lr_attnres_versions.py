"""LR-AttnRes's model at every version of its model.py a checkpoint's model_args can come from, on the same weights.

    /tmp/authors-venv/bin/python scripts/authors/lr_attnres_versions.py --repo <their git dir> --first <c> --last <c>

Their checkpoints record ``model_args = asdict(ModelConfig)`` (train.py's build_checkpoint), so a checkpoint carries
exactly the ModelConfig fields of the code that wrote it, and a field added later is absent. This script walks every
commit from ``--first`` to ``--last`` that changed model.py or attnres_ops.py (``git log``), exports those two files,
reads the commit's ModelConfig fields and defaults as data (the dataclass's AST), and runs a grid of cases (the
train.py flags each block / P-LR / S-LR option is set by) on their OBPM at that commit: a case's fields that the
commit lacks are dropped, as its train.py could not set them. Each run's model_args (asdict, after their
__post_init__), seeded random weights (the same for every commit: the same names, shapes and seed) and their fp64
logits are written to tests/fixtures/authors/lr-attnres-versions/; a run their code refuses records the error.
tests/checkpoints/test_authors_versions.py maps every run's model_args and weights through probe's loader and compares.
Identical weights and logits are stored once.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from common import (
    FIXTURES,
    FP64_CONSTANTS_PATCH,
    KEEP_FP64_PATCH,
    fp64_constants,
    keep_fp64_through_float,
    load_module,
    randomize,
    versions,
)
from safetensors.torch import save_file

REPOSITORY = "jon123boss/LR-AttnRes"
FILES = ("model.py", "attnres_ops.py")
TINY = dict(
    block_size=8,
    vocab_size=32,
    n_layer=2,
    n_head=2,
    n_embd=8,
    mlp_hidden_dim=16,
    mlp_ratio=None,
    lrid_rank=4,
    rope_theta=500000.0,
    qk_norm=True,
    norm_pos="before",
    flash_attention=False,
    weight_tying=False,
    lrid_use_logit_scale=False,
)
BLOCK = dict(attnres_type="block", attnres_num_blocks=2)  # 2L = 4 sub-layers: blocks of 2 (log-count prior matters)
PLR, ATTNRES = dict(use_lrid=True), dict(use_attnres=True)
MEAN, SUM = dict(attnres_block_average=True), dict(attnres_block_average=False)
PRIOR, NO_PRIOR = dict(attnres_block_count_prior=True), dict(attnres_block_count_prior=False)
CASES = {  # name -> the ModelConfig fields train.py's flags set (TINY besides)
    "baseline": dict(use_attnres=False, use_lrid=False),
    "attnres-full": {**ATTNRES, "attnres_type": "full"},
    "attnres-block": {**ATTNRES, **BLOCK, **SUM, **NO_PRIOR},
    "attnres-block-mean": {**ATTNRES, **BLOCK, **MEAN, **NO_PRIOR},
    "attnres-block-mean-prior": {**ATTNRES, **BLOCK, **MEAN, **PRIOR},
    "plr-full": {**PLR, "attnres_type": "full"},
    "plr-block": {**PLR, **BLOCK, **SUM, **NO_PRIOR},
    "plr-block-mean": {**PLR, **BLOCK, **MEAN, **NO_PRIOR},
    "plr-block-mean-prior": {**PLR, **BLOCK, **MEAN, **PRIOR},
    "plr-block-sqrt": {**PLR, **BLOCK, **MEAN, "attnres_block_average_mode": "sqrt", **NO_PRIOR},
    "plr-block-sum-prior": {**PLR, **BLOCK, **SUM, **PRIOR},
    "slr-block-mean-prior": {**PLR, **BLOCK, **MEAN, **PRIOR, "lrid_key_from_output_tail": True},
    "plr-block-powers": {**PLR, **BLOCK, **MEAN, **PRIOR, "attnres_block_alpha": 0.5, "attnres_block_beta": 0.75},
    "plr-block-learned": {
        **PLR,
        **BLOCK,
        **MEAN,
        **PRIOR,
        "attnres_block_alpha_learned": True,
        "attnres_block_beta_learned": True,
    },
}
SEED, T = 0, 8


def git(repo: Path, *args: str) -> str:
    return subprocess.check_output(["git", "-C", str(repo), *args], text=True)


def config_fields(source: str) -> dict:
    """ModelConfig's fields -> their default's source text, read from model.py's AST (not run)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == "ModelConfig":
            return {
                s.target.id: ast.unparse(s.value) if s.value is not None else None
                for s in node.body
                if isinstance(s, ast.AnnAssign)
            }
    raise RuntimeError("model.py has no ModelConfig")


def field_changes(previous: dict | None, fields: dict) -> dict:
    """A commit's ModelConfig against the previous commit's: every field (the first), else what was added, removed
    or given another default."""
    if previous is None:
        return {"fields": fields}
    out = {
        "fields_added": {k: v for k, v in fields.items() if k not in previous},
        "fields_removed": sorted(set(previous) - set(fields)),
        "defaults_changed": {k: v for k, v in fields.items() if k in previous and previous[k] != v},
    }
    return {k: v for k, v in out.items() if v}


def export(repo: Path, commit: str, dest: Path) -> list[str]:
    have = set(git(repo, "ls-tree", "--name-only", commit).split())
    dest.mkdir(parents=True, exist_ok=True)
    files = [f for f in FILES if f in have]
    for f in files:
        (dest / f).write_text(git(repo, "show", f"{commit}:{f}"))
    return files


def run_case(mod, settings: dict, ids: torch.Tensor):
    """(model_args, fp32 state dict, fp64 logits of those weights) at this commit, or the error their code raised."""
    try:
        model = mod.OBPM(mod.ModelConfig(**settings)).double()
    except Exception as e:  # noqa: BLE001 - their validation: recorded, as the answer for these settings
        return f"{type(e).__name__}: {e}"
    randomize(model, SEED)
    state = {k: v.float() for k, v in model.state_dict().items()}  # the fp32 weights a checkpoint would hold
    model.load_state_dict({k: v.double() for k, v in state.items()})
    with torch.no_grad(), keep_fp64_through_float(), fp64_constants():
        out = model.eval()(ids)
    logits = out[0] if isinstance(out, tuple) else out
    return dataclasses.asdict(model.config), state, logits


def digest(tensors: dict) -> str:
    h = hashlib.sha1()
    for k in sorted(tensors):
        h.update(k.encode() + str(tuple(tensors[k].shape)).encode() + tensors[k].contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, required=True, help="their repository (a clone or a bare mirror)")
    ap.add_argument("--first", required=True, help="the oldest commit whose ModelConfig probe reads")
    ap.add_argument("--last", required=True, help="the newest commit")
    args = ap.parse_args(argv)
    log = git(args.repo, "log", "--reverse", "--format=%H %cI %s", f"{args.first}^..{args.last}", "--", *FILES)
    commits = [line.split(" ", 2) for line in log.splitlines() if line]
    ids = torch.randint(0, TINY["vocab_size"], (1, T), generator=torch.Generator().manual_seed(SEED + 1))
    weights, outputs, defaults, meta_commits, runs, previous = {}, {}, {}, [], {}, None
    with tempfile.TemporaryDirectory() as tmp:
        for commit, date, subject in commits:
            src = Path(tmp) / commit
            files = export(args.repo, commit, src)
            for name in ("attnres_ops", "model"):
                sys.modules.pop(name, None)
            fields = config_fields((src / "model.py").read_text())
            record = {"commit": commit, "date": date, "subject": subject, **field_changes(previous, fields)}
            previous = fields
            record["blobs"] = {f: git(args.repo, "rev-parse", f"{commit}:{f}").strip() for f in files}
            try:
                mod = load_module(src / "model.py", f"lr_attnres_model_{commit[:7]}")
            except ImportError as e:  # 0c4f10e imports its liger-kernel wrappers: recorded, not run
                meta_commits.append({**record, "import_error": f"{type(e).__name__}: {e}"})
                print(commit[:7], date, "not importable:", e, flush=True)
                continue
            default_args = dataclasses.asdict(mod.ModelConfig(**{k: v for k, v in TINY.items() if k in fields}))
            defaults_id = hashlib.sha1(json.dumps(default_args, sort_keys=True).encode()).hexdigest()[:12]
            defaults[defaults_id] = default_args
            meta_commits.append({**record, "defaults": defaults_id})
            seen, runs[commit] = {}, {}
            for case, options in CASES.items():
                settings = {k: v for k, v in {**TINY, **options}.items() if k in fields}
                key = json.dumps(settings, sort_keys=True)
                row = {"dropped": sorted(set(options) - set(fields))} if set(options) - set(fields) else {}
                if key in seen:  # the commit cannot tell this case from an earlier one: the same run
                    runs[commit][case] = {**row, "same_as": seen[key]}
                    continue
                seen[key] = case
                result = run_case(mod, settings, ids)
                if isinstance(result, str):
                    runs[commit][case] = {**row, "error": result.splitlines()[0]}
                    continue
                model_args, state, logits = result
                wid, oid = digest(state), digest({"logits": logits})
                weights.setdefault(wid, state)
                outputs.setdefault(oid, logits)
                diff = {k: v for k, v in model_args.items() if default_args.get(k, object()) != v}
                runs[commit][case] = {**row, "model_args": diff, "weights": wid, "logits": oid}
            print(commit[:7], date, len(seen), "runs", flush=True)

    out = FIXTURES / "lr-attnres-versions"
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {f"{w}/{k}": v.contiguous() for w, state in weights.items() for k, v in state.items()},
        out / "weights.safetensors",
    )
    save_file({o: v.contiguous() for o, v in outputs.items()}, out / "outputs.safetensors")
    save_file({"input_ids": ids}, out / "inputs.safetensors")
    meta = {
        "repository": REPOSITORY,
        "first": args.first,
        "last": args.last,
        "files": list(FILES),
        "commits": meta_commits,
        "defaults": defaults,
        "tiny": TINY,
        "cases": CASES,
        "runs": runs,  # commit -> case -> {model_args, weights, logits} | {same_as} | {error}; dropped: fields it lacks
        "seed": SEED,
        "inputs": {"shape": [1, T]},
        "entry": "OBPM(ModelConfig(**settings)).double(); fp32 weights; model(input_ids) (their plain forward)",
        "weights": f"randomize(model, {SEED}) (N(0, 1/fan-in), 1-d N(0, 1), their parameter order) cast to fp32, "
        "RoPE buffers as their RotaryEmbedding computes them; stored once per distinct state dict (digest)",
        "model_args": "each run's asdict(ModelConfig) after __post_init__, as the fields that differ from that "
        "commit's asdict(ModelConfig(**tiny)) (defaults[the commit's id])",
        "commits[].fields": "the first commit's ModelConfig fields -> the source text of their defaults (read from "
        "model.py's AST); later commits list fields_added, fields_removed and defaults_changed against the previous",
        "patches": [KEEP_FP64_PATCH, FP64_CONSTANTS_PATCH],
        "versions": versions("einops"),
        "script": "scripts/authors/lr_attnres_versions.py",
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(out, len(weights), "weight sets,", len(outputs), "distinct logits")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
