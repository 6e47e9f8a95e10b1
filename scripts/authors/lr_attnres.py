"""Golden outputs of the LR-AttnRes authors' model (jon123boss/LR-AttnRes ``model.py``) for probe's depth routing.

    git -C <mirror> archive <commit> model.py attnres_ops.py | tar -x -C /tmp/lr-attnres
    /tmp/authors-venv/bin/python scripts/authors/lr_attnres.py --src /tmp/lr-attnres --commit <commit>

Builds their ``OBPM`` at a tiny size for each mechanism (AttnRes full / block, S-LR full / block, P-LR full / block,
and P-LR block with their block mean and log-count prior), draws seeded random weights (queries included, so the
routing is not uniform), and runs one batch in fp64 and in fp32. Writes tests/fixtures/authors/<mechanism>/: the
weights under their names, the input ids, the logits, every read site's output and mixing weights, and meta.json.
tests/models/test_authors_golden.py maps the weights into probe and compares.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.nn.functional as F
from common import (
    FP64_CONSTANTS_PATCH,
    KEEP_FP64_PATCH,
    fp64_constants,
    git_blob_sha1,
    keep_fp64_through_float,
    load_module,
    randomize,
    source_parser,
    versions,
    write_fixture,
)

REPOSITORY = "jon123boss/LR-AttnRes"
FILE = "model.py"
BASE = dict(
    block_size=16,
    vocab_size=32,
    n_layer=3,
    n_head=2,
    n_embd=16,
    mlp_hidden_dim=32,
    weight_tying=False,
    rope_theta=10000.0,
    norm_pos="before",
    qk_norm=True,
    flash_attention=False,
    use_fused_attnres=False,
)
BLOCK = dict(attnres_type="block", attnres_num_blocks=2)  # 2L = 6 sub-layers: blocks of 3 (partials of 1 and 2)
NO_BLOCK_OPTIONS = dict(attnres_block_average=False, attnres_block_count_prior=False)  # probe's defaults
MECHANISMS = {
    "attnres-full": dict(use_attnres=True, attnres_type="full"),
    "attnres-block": dict(use_attnres=True, **BLOCK, **NO_BLOCK_OPTIONS),
    "slr-full": dict(use_lrid=True, lrid_rank=4, lrid_key_from_output_tail=True, attnres_type="full"),
    "slr-block": dict(use_lrid=True, lrid_rank=4, lrid_key_from_output_tail=True, **BLOCK, **NO_BLOCK_OPTIONS),
    "plr-full": dict(use_lrid=True, lrid_rank=4, attnres_type="full"),
    "plr-block": dict(use_lrid=True, lrid_rank=4, **BLOCK, **NO_BLOCK_OPTIONS),
    # their training defaults: a block value divided by its count, log(count) added to its logit
    "plr-block-mean-prior": dict(
        use_lrid=True, lrid_rank=4, **BLOCK, attnres_block_average=True, attnres_block_count_prior=True
    ),
}
SEED, BATCH, T = 0, 2, 8
MAPPING = {
    "transformer.wte.weight": "embed.weight",
    "transformer.layers.{l}.attn.c_attn.weight": "rows [0:d] -> blocks.{l}.attn.q_proj.weight, [d:2d] -> k_proj, "
    "[2d:3d] -> v_proj; q and k rows permuted within each head from "
    "their interleaved RoPE pairs (2i, 2i+1) to probe's rotate-half "
    "pairs (i, i + d_head/2)",
    "transformer.layers.{l}.attn.c_proj[.proj].weight": "rows [0:d] -> blocks.{l}.attn.o_proj.weight; P-LR: rows "
    "[d:d+r] -> blocks.{l}.attn.key_proj.weight",
    "transformer.layers.{l}.mlp.fc1.weight": "rows [0:m] -> blocks.{l}.mlp.up.weight, [m:2m] -> mlp.gate.weight "
    "(their x, gate = chunk(2); silu(gate) * x)",
    "transformer.layers.{l}.mlp.fc2[.proj].weight": "rows [0:d] -> blocks.{l}.mlp.down.weight; P-LR: rows [d:d+r] "
    "-> blocks.{l}.mlp.key_proj.weight",
    "transformer.lrid_embedding_key.proj.weight": "embed_key.weight (P-LR)",
    "transformer.attn_residuals.{t-1}.query / transformer.lrid_queries.{t-1}": "the query of read site t (1..2L: "
    "t = 2l+1 -> blocks.{l}.mlp_read, t = 2l (l >= 1) -> blocks.{l}.attn_read, t = 2L -> final_read), times "
    "their lrid_logit_scale (1/sqrt(r)) for S-LR / P-LR: probe's logits are q . RMSNorm(k) unscaled",
    "lm_head.weight": "lm_head.weight",
    "(none: their norms have no gain)": "every probe norm weight = 1 (ln1, ln2, ln_f, q_norm, k_norm); probe norm_eps "
    "= torch.finfo(dtype).eps, as their norm(x) with eps=None",
}


@contextlib.contextmanager
def recording_reads(model, record: dict):
    """Record each read site's output (residual index t -> B,T,d) and mixing weights (t -> B,T,S), by wrapping
    their read methods and, during a read, F.softmax (the only softmax a read calls; token attention uses SDPA)."""
    originals = {name: getattr(model, name) for name in ("_apply_attnres", "_apply_lrid_attnres")}
    softmax = F.softmax

    def wrap(method):
        def read(residual_idx, sources, *args, **kwargs):
            seen = []

            def recording_softmax(x, *a, **k):
                seen.append(softmax(x, *a, **k))
                return seen[-1]

            F.softmax = recording_softmax
            try:
                out = method(residual_idx, sources, *args, **kwargs)
            finally:
                F.softmax = softmax
            record[f"read.{residual_idx}"] = out
            if seen:  # (S, B, T) or (S, B, T, heads=1) -> B, T, S
                w = seen[-1]
                record[f"weights.{residual_idx}"] = (w[..., 0] if w.dim() == 4 else w).permute(1, 2, 0)
            return out

        return read

    for name, method in originals.items():
        setattr(model, name, wrap(method))
    try:
        yield
    finally:
        for name in originals:
            delattr(model, name)  # back to the class's methods


def run(mod, settings: dict, weights: dict, ids: torch.Tensor, dtype) -> dict:
    model = mod.OBPM(mod.ModelConfig(**settings)).to(dtype).eval()
    missing, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=False)
    assert not unexpected and all(k.endswith((".sin", ".cos")) for k in missing), (missing, unexpected)  # RoPE tables
    record: dict = {}
    patches = (keep_fp64_through_float(), fp64_constants()) if dtype == torch.float64 else ()
    with torch.no_grad(), contextlib.ExitStack() as stack, recording_reads(model, record):
        for patch in patches:
            stack.enter_context(patch)
        record["logits"] = model(ids)
    return {k: v.to(dtype) for k, v in record.items()}


def main(argv=None) -> int:
    ap = source_parser(__doc__, "folder holding their model.py and attnres_ops.py")
    ap.add_argument("--only", nargs="*", choices=list(MECHANISMS), help="some mechanisms only")
    args = ap.parse_args(argv)
    mod = load_module(args.src / FILE, "lr_attnres_model")
    torch.manual_seed(SEED)
    for name in args.only or MECHANISMS:
        settings = {**BASE, **MECHANISMS[name]}
        model = mod.OBPM(mod.ModelConfig(**settings)).double()
        randomize(model, SEED)
        weights = {k: v.clone() for k, v in model.state_dict().items() if not k.endswith((".sin", ".cos"))}
        ids = torch.randint(0, settings["vocab_size"], (BATCH, T), generator=torch.Generator().manual_seed(SEED + 1))
        out64 = run(mod, settings, weights, ids, torch.float64)
        out32 = run(mod, settings, weights, ids, torch.float32)
        config = dataclasses.asdict(mod.ModelConfig(**settings))  # after their __post_init__ (logit scale, ...)
        meta = {
            "repository": REPOSITORY,
            "commit": args.commit,
            "file": FILE,
            "file_blob_sha1": git_blob_sha1(args.src / FILE),
            "also_imported": {"attnres_ops.py": git_blob_sha1(args.src / "attnres_ops.py")},
            "entry": "OBPM(ModelConfig(**settings)).eval()(input_ids) (their plain, unfused forward)",
            "settings": settings,
            "config_after_post_init": config,
            "seed": SEED,
            "inputs": {"shape": [BATCH, T]},
            "weights": "every parameter N(0, 1/fan-in) (1-d: N(0, 1)) in fp64 from torch.Generator seed "
            f"{SEED}, in their parameter order (queries included)",
            "outputs": {
                "logits": "B,T,V",
                "read.{t}": "B,T,d: the read before sub-layer t (t = 2L: before the final norm)",
                "weights.{t}": "B,T,S: that read's softmax over its sources (t >= 1)",
                "suffixes": "fp64 outputs as named; fp32 run of the same weights under fp32/",
            },
            "patches": [KEEP_FP64_PATCH, FP64_CONSTANTS_PATCH],
            "versions": versions("einops"),
            "mapping_to_probe": MAPPING,
            "script": "scripts/authors/lr_attnres.py",
        }
        outputs = {**out64, **{f"fp32/{k}": v for k, v in out32.items()}}
        path = write_fixture(name, weights=weights, inputs={"input_ids": ids}, outputs=outputs, meta=meta)
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
