"""Golden outputs of gpt-oss's attention with learned sinks (openai/gpt-oss ``gpt_oss/torch/model.py``).

    git -C <mirror> archive <commit> gpt_oss | tar -x -C /tmp/gpt-oss
    /tmp/authors-venv/bin/python scripts/authors/gpt_oss_sink.py --src /tmp/gpt-oss --commit <commit>

Two checks, one fixture (tests/fixtures/authors/gpt-oss-sink/):
  block:  their ``AttentionBlock`` (RMSNorm, fused qkv, YaRN RoPE with scaling factor 1 = plain rotate-half RoPE, GQA,
          one sink logit per query head, output projection, residual add) at layer index 1 (no sliding window), on
          seeded random weights with the qkv/out biases set to 0 (probe's attention has none): the block output, the
          attention pattern and the sink's share of each row.
  sdpa:   their ``sdpa`` with a sliding window of 3 on random Q, K, V and sinks: the output and the pattern.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from common import (
    KEEP_FP64_PATCH,
    git_blob_sha1,
    keep_fp64_through_float,
    load_module,
    randomize,
    source_parser,
    versions,
    write_fixture,
)

REPOSITORY = "openai/gpt-oss"
FILE = "gpt_oss/torch/model.py"
SETTINGS = dict(
    num_hidden_layers=2,
    num_experts=2,
    experts_per_token=1,
    vocab_size=32,
    hidden_size=16,
    intermediate_size=16,
    head_dim=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    sliding_window=3,
    initial_context_length=64,
    rope_theta=10000.0,
    rope_scaling_factor=1.0,
)
LAYER_IDX = 1  # odd layers have no sliding window (probe's model has none); the window is checked on sdpa
SEED, T, WINDOW = 0, 8, 3
MAPPING = {
    "norm.scale": "ln1.weight (probe norm_eps = their 1e-5)",
    "qkv.weight": "rows [0:H*dh] -> attn.q_proj.weight, [H*dh:(H+Hkv)*dh] -> k_proj, the rest -> v_proj (same "
    "head order: query head h = kv * (H/Hkv) + m reads kv head h // (H/Hkv), as probe's GQA)",
    "qkv.bias, out.bias": "set to 0 before the run (probe's projections have no bias)",
    "sinks": "attn.sink (the phantom key's logit per query head)",
    "out.weight": "attn.o_proj.weight",
    "RoPE": "rope_scaling_factor 1: concentration 1 and inv_freq = 1/theta^(2i/dh), rotate-half as probe's Rotary",
}


@contextlib.contextmanager
def recording_softmax(record: list):
    softmax = torch.softmax

    def recording(x, *a, **k):
        record.append(softmax(x, *a, **k))
        return record[-1]

    torch.softmax = recording
    try:
        yield
    finally:
        torch.softmax = softmax


def run_block(mod, weights: dict, x: torch.Tensor, dtype) -> dict:
    block = mod.AttentionBlock(mod.ModelConfig(**SETTINGS), layer_idx=LAYER_IDX).to(dtype)
    block.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=True)
    seen: list = []
    patch = keep_fp64_through_float() if dtype == torch.float64 else contextlib.nullcontext()
    with torch.no_grad(), patch, recording_softmax(seen):
        out = block(x.to(dtype))
    w = seen[-1]  # (Hkv, G, T, T + 1): the last column is the sink
    H = SETTINGS["num_attention_heads"]
    return {
        "block/out": out,
        "block/pattern": w[..., :-1].reshape(H, T, T),
        "block/sink_share": w[..., -1].reshape(H, T),
    }


def run_sdpa(mod, inputs: dict, dtype) -> dict:
    seen: list = []
    q, k, v, s = (inputs[f"sdpa/{n}"].to(dtype) for n in ("q", "k", "v", "sinks"))
    with torch.no_grad(), recording_softmax(seen):
        out = mod.sdpa(q, k, v, s, 1 / q.shape[-1] ** 0.5, sliding_window=WINDOW)
    w = seen[-1]
    H = SETTINGS["num_attention_heads"]
    return {"sdpa/out": out, "sdpa/pattern": w[..., :-1].reshape(H, T, T), "sdpa/sink_share": w[..., -1].reshape(H, T)}


def main(argv=None) -> int:
    ap = source_parser(__doc__, "folder holding their gpt_oss package")
    args = ap.parse_args(argv)
    mod = load_module(args.src / FILE, "gpt_oss.torch.model", extra_sys_path=args.src)
    block = mod.AttentionBlock(mod.ModelConfig(**SETTINGS), layer_idx=LAYER_IDX).double()
    randomize(block, SEED)
    with torch.no_grad():
        block.qkv.bias.zero_()
        block.out.bias.zero_()
    weights = {k: v.clone() for k, v in block.state_dict().items()}
    g = torch.Generator().manual_seed(SEED + 1)
    d, H, Hkv, dh = (SETTINGS[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim"))
    inputs = {
        "block/x": torch.randn(T, d, generator=g, dtype=torch.float64),
        "sdpa/q": torch.randn(T, Hkv, H // Hkv, dh, generator=g, dtype=torch.float64),
        "sdpa/k": torch.randn(T, Hkv, dh, generator=g, dtype=torch.float64),
        "sdpa/v": torch.randn(T, Hkv, dh, generator=g, dtype=torch.float64),
        "sdpa/sinks": torch.randn(H, generator=g, dtype=torch.float64),
    }
    outputs = {}
    for dtype, prefix in ((torch.float64, ""), (torch.float32, "fp32/")):
        res = {**run_block(mod, weights, inputs["block/x"], dtype), **run_sdpa(mod, inputs, dtype)}
        outputs.update({prefix + k: v.to(dtype) for k, v in res.items()})
    meta = {
        "repository": REPOSITORY,
        "commit": args.commit,
        "file": FILE,
        "file_blob_sha1": git_blob_sha1(args.src / FILE),
        "entry": {
            "block": f"AttentionBlock(ModelConfig(**settings), layer_idx={LAYER_IDX})(x), x (T, d)",
            "sdpa": f"sdpa(Q, K, V, S, 1/sqrt(dh), sliding_window={WINDOW})",
        },
        "settings": SETTINGS,
        "config": dataclasses.asdict(mod.ModelConfig(**SETTINGS)),
        "seed": SEED,
        "weights": f"every parameter N(0, 1/fan-in) (1-d: N(0, 1)) in fp64 from torch.Generator seed {SEED}, "
        "then qkv.bias and out.bias set to 0",
        "outputs": {
            "*/out": "block: x + attention (T, d); sdpa: (T, H*dh)",
            "*/pattern": "(H, T, T) softmax weights on the real keys",
            "*/sink_share": "(H, T) the sink column of the softmax",
            "fp32/": "the same run in fp32",
        },
        "patches": [KEEP_FP64_PATCH + " (their RMSNorm upcasts with .float())"],
        "versions": versions(),
        "mapping_to_probe": MAPPING,
        "script": "scripts/authors/gpt_oss_sink.py",
    }
    print(write_fixture("gpt-oss-sink", weights=weights, inputs=inputs, outputs=outputs, meta=meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
