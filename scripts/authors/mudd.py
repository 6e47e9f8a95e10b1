"""Golden outputs of MUDDFormer (Caiyun-AI/MUDDFormer ``pytorch/muddformer/modeling_muddformer.py``).

    git -C <mirror> archive <commit> pytorch/muddformer | tar -x -C /tmp/muddformer
    /tmp/authors-venv/bin/python scripts/authors/mudd.py --src /tmp/muddformer/pytorch/muddformer --commit <commit>

Their ``MUDDFormer`` (dense_type 'qkvr', dynamic dense, sepln) at a tiny size with seeded random weights (the norm
gains keep their init, ones), one batch in fp64 and in fp32: logits, each layer's dense mixing weights (C,B,T,L)
and mixed streams. Writes tests/fixtures/authors/mudd/.
"""

from __future__ import annotations

import contextlib

import torch
from common import (
    KEEP_FP64_CASTS_PATCH,
    KEEP_FP64_PATCH,
    git_blob_sha1,
    keep_fp64_through_float,
    keep_fp64_through_fp32_casts,
    load_module,
    randomize,
    source_parser,
    versions,
    write_fixture,
)

REPOSITORY = "Caiyun-AI/MUDDFormer"
FILE = "pytorch/muddformer/modeling_muddformer.py"
# intermediate_size 200: their per-layer FFN widths round(200 * (l/(L-1) + 0.5) / 128) * 128 = 128 and 256
SETTINGS = dict(
    block_size=16,
    vocab_size=32,
    n_layer=2,
    n_head=2,
    dim=16,
    intermediate_size=200,
    rope_base=10000,
    norm_eps=1e-6,
    is_training=True,
    use_qk_norm=False,
    dense_type="qkvr",
    dense=True,
    dynamic_dense=True,
    sepln=True,
    stack_hidden=False,
    expand_last=False,
    round64=False,
)
SEED, BATCH, T = 0, 2, 8
MAPPING = {
    "tok_embeddings.weight": "embed.weight",
    "layers.{l}.attention.w{q,k,v}.weight": "blocks.{l}.attn.{q,k,v}_proj.weight (both rotate-half RoPE)",
    "layers.{l}.attention.wo.weight": "blocks.{l}.attn.o_proj.weight",
    "layers.{l}.feed_forward.w1 / w3 / w2": "blocks.{l}.mlp.gate / up / down, zero-padded to probe's one d_mlp = "
    "their widest layer (their widths grow with depth; zero hidden units "
    "add exactly 0)",
    "layers.0.attention_norm / layers.{l>0}.attention_norms.{0,1,2}": "blocks.{l}.ln1 (probe shares one norm over "
    "the q/k/v streams; all are ones here)",
    "layers.{l}.ffn_norm.weight": "blocks.{l}.ln2.weight",
    "dynamic_dense.{l}.w1 / w2": "blocks.{l}.dense.w1 / w2 (RMSNorm without gain = probe's dense.norm with gain 1)",
    "dense_bs.{l}": "blocks.{l}.dense.bias",
    "norm.weight": "ln_f.weight",
    "output.weight": "lm_head.weight",
}


@contextlib.contextmanager
def recording_dense(model, record: dict):
    """Record each layer's mixing weights (their dynamic part + dense_bs) and mixed streams."""
    originals = [blk.layer_mix for blk in model.dynamic_dense]
    for l, blk in enumerate(model.dynamic_dense):

        def layer_mix(hids, dw, _l=l, _orig=originals[l]):
            out = _orig(hids, dw)
            record[f"dense_weights.{_l}"] = dw  # C,B,T,L
            for c, stream in enumerate(out):
                record[f"stream.{_l}.{c}"] = stream
            return out

        blk.layer_mix = layer_mix
    try:
        yield
    finally:
        for blk in model.dynamic_dense:
            del blk.layer_mix


def fp32_rope_table(mod, model) -> None:
    """Their precompute_freqs_cis rounds the RoPE table to bf16 (``cache.to(torch.bfloat16)``); keep it fp32."""
    to = torch.Tensor.to

    def to_skipping_bf16(self, *args, **kwargs):
        if kwargs.get("dtype") == torch.bfloat16 or (args and args[0] == torch.bfloat16):
            return self
        return to(self, *args, **kwargs)

    torch.Tensor.to = to_skipping_bf16
    try:
        model.freqs_cis = mod.precompute_freqs_cis(
            SETTINGS["block_size"], SETTINGS["dim"] // SETTINGS["n_head"], SETTINGS["rope_base"]
        )
    finally:
        torch.Tensor.to = to


def build(mod, cfg_mod, dtype):
    model = mod.MUDDFormer(cfg_mod.MUDDFormerConfig(**SETTINGS)).to(dtype).eval()
    model.setup_caches(max_batch_size=BATCH, max_seq_length=SETTINGS["block_size"])
    fp32_rope_table(mod, model)
    return model


def run(mod, cfg_mod, weights: dict, ids: torch.Tensor, dtype) -> dict:
    model = build(mod, cfg_mod, dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=True)
    record: dict = {}
    patches = (keep_fp64_through_fp32_casts(), keep_fp64_through_float()) if dtype == torch.float64 else ()
    with torch.no_grad(), contextlib.ExitStack() as stack, recording_dense(model, record):
        for patch in patches:
            stack.enter_context(patch)
        record["logits"] = model(ids, return_tensor=True)
    record["tables/rope"] = model.freqs_cis  # block_size, d_head/2, (cos, sin): from torch.polar
    return {k: v.to(dtype) for k, v in record.items()}


def main(argv=None) -> int:
    ap = source_parser(__doc__, "their pytorch/muddformer folder")
    args = ap.parse_args(argv)
    cfg_mod = load_module(args.src / "configuration_muddformer.py", "configuration_muddformer")
    mod = load_module(args.src / "modeling_muddformer.py", "modeling_muddformer")
    model = build(mod, cfg_mod, torch.float64)
    randomize(model, SEED, skip={n for n, _ in model.named_parameters() if "norm" in n})  # norm gains: their ones
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, SETTINGS["vocab_size"], (BATCH, T), generator=torch.Generator().manual_seed(SEED + 1))
    outputs = run(mod, cfg_mod, weights, ids, torch.float64)
    outputs.update({f"fp32/{k}": v for k, v in run(mod, cfg_mod, weights, ids, torch.float32).items()})
    meta = {
        "repository": REPOSITORY,
        "commit": args.commit,
        "file": FILE,
        "file_blob_sha1": git_blob_sha1(args.src / "modeling_muddformer.py"),
        "also_imported": {
            "pytorch/muddformer/configuration_muddformer.py": git_blob_sha1(args.src / "configuration_muddformer.py")
        },
        "entry": "m = MUDDFormer(MUDDFormerConfig(**settings)).eval(); m.setup_caches(B, block_size); "
        "m(input_ids, return_tensor=True)",
        "settings": SETTINGS,
        "seed": SEED,
        "inputs": {"shape": [BATCH, T]},
        "ffn_widths": [blk.feed_forward.w1.out_features for blk in model.layers],
        "weights": f"every parameter except the norm gains (their ones) N(0, 1/fan-in) (1-d: N(0, 1)) in fp64 "
        f"from torch.Generator seed {SEED}, in their parameter order",
        "outputs": {
            "logits": "B,T,V",
            "dense_weights.{l}": "C,B,T,L: after layer l, dynamic + static weights "
            "of each stream (q, k, v, r; the last layer: one) over X_0..X_{l+1}",
            "stream.{l}.{c}": "B,T,d: the mixed stream c after layer l",
            "tables/rope": "their RoPE table (block_size, d_head/2, cos|sin), fp32 angles; torch.polar "
            "differs from torch.cos/sin by an ulp",
            "fp32/": "the same in fp32",
        },
        "patches": [
            KEEP_FP64_CASTS_PATCH,
            KEEP_FP64_PATCH,
            "the RoPE table is computed by their precompute_freqs_cis with its final bf16 cast skipped "
            "(fp32, as probe's), in both runs",
        ],
        "versions": versions("einops", "transformers"),
        "mapping_to_probe": MAPPING,
        "script": "scripts/authors/mudd.py",
    }
    print(write_fixture("mudd", weights=weights, inputs={"input_ids": ids}, outputs=outputs, meta=meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
