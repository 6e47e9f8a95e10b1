"""Golden outputs of ResFormer's value residual (Zcchill/Value-Residual-Learning ``modeling_llama_resformer.py``).

    git -C <mirror> archive <commit> src/modeling/modeling_llama_resformer.py | tar -x -C /tmp/resformer
    /tmp/authors-venv/bin/python scripts/authors/value_residual.py \
        --src /tmp/resformer/src/modeling/modeling_llama_resformer.py --commit <commit>

Their ``LlamaForCausalLM`` (a Llama whose every layer after the first uses V_n <- 0.5 V_1 + 0.5 V_n) at a tiny size
with seeded random weights (transformers 4.45, the version their file was written against; eager attention), one
batch in fp64 and in fp32: logits, each layer's output and attention weights. Writes
tests/fixtures/authors/value-residual/.
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

REPOSITORY = "Zcchill/Value-Residual-Learning"
FILE = "src/modeling/modeling_llama_resformer.py"
SETTINGS = dict(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=16,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
    hidden_act="silu",
    attn_implementation="eager",
)
SEED, BATCH, T = 0, 2, 8
MAPPING = {
    "model.embed_tokens.weight": "embed.weight",
    "model.layers.{l}.self_attn.{q,k,v,o}_proj.weight": "blocks.{l}.attn.{q,k,v,o}_proj.weight (both rotate-half RoPE)",
    "model.layers.{l}.mlp.{gate,up,down}_proj.weight": "blocks.{l}.mlp.{gate,up,down}.weight",
    "model.layers.{l}.input_layernorm.weight / post_attention_layernorm.weight": "blocks.{l}.ln1.weight / ln2.weight",
    "model.norm.weight": "ln_f.weight",
    "lm_head.weight": "lm_head.weight",
    "(their constant 0.5)": "blocks.{l}.attn.v_mix = 0.5 for l >= 1 (probe value_residual='lambda': "
    "V_n <- (1 - lambda) V_n + lambda V_1)",
}


def run(mod, weights: dict, ids: torch.Tensor, dtype) -> dict:
    config = mod.LlamaConfig(**SETTINGS)
    model = mod.LlamaForCausalLM(config).to(dtype).eval()
    model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=True)
    for m in model.modules():  # RoPE frequencies stay as their init made them (fp32), whatever the model's dtype
        if isinstance(m, mod.LlamaRotaryEmbedding):
            m.inv_freq = m.original_inv_freq = m.inv_freq.float()
    patches = (keep_fp64_through_fp32_casts(), keep_fp64_through_float()) if dtype == torch.float64 else ()
    with torch.no_grad(), contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        out = model(ids, output_hidden_states=True, output_attentions=True)
    L = SETTINGS["num_hidden_layers"]
    res = {"logits": out.logits}
    # hidden_states: the embedding, each layer's output, and the last one after the final norm
    res.update({f"resid_post.{l}": out.hidden_states[l + 1] for l in range(L - 1)})
    res.update({f"pattern.{l}": out.attentions[l] for l in range(L)})
    return {k: v.to(dtype) for k, v in res.items()}


def main(argv=None) -> int:
    ap = source_parser(__doc__, "their modeling_llama_resformer.py")
    args = ap.parse_args(argv)
    mod = load_module(args.src, "modeling_llama_resformer")
    model = mod.LlamaForCausalLM(mod.LlamaConfig(**SETTINGS)).double()
    randomize(model, SEED, skip={n for n, _ in model.named_parameters() if "norm" in n})  # norms: their ones
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, SETTINGS["vocab_size"], (BATCH, T), generator=torch.Generator().manual_seed(SEED + 1))
    outputs = run(mod, weights, ids, torch.float64)
    outputs.update({f"fp32/{k}": v for k, v in run(mod, weights, ids, torch.float32).items()})
    meta = {
        "repository": REPOSITORY,
        "commit": args.commit,
        "file": FILE,
        "file_blob_sha1": git_blob_sha1(args.src),
        "entry": "LlamaForCausalLM(LlamaConfig(**settings)).eval()(input_ids, output_hidden_states=True, "
        "output_attentions=True)",
        "settings": SETTINGS,
        "seed": SEED,
        "inputs": {"shape": [BATCH, T]},
        "weights": f"every parameter except the norms (their ones) N(0, 1/fan-in) in fp64 from torch.Generator "
        f"seed {SEED}, in their parameter order",
        "outputs": {
            "logits": "B,T,V",
            "resid_post.{l}": "B,T,d: layer l's output (l < L-1)",
            "pattern.{l}": "B,H,T,T attention weights",
            "fp32/": "the same run in fp32",
        },
        "patches": [
            KEEP_FP64_CASTS_PATCH,
            KEEP_FP64_PATCH + " (their logits are .float()-ed)",
            "each LlamaRotaryEmbedding.inv_freq is kept in fp32 (as their init computes it) after "
            "model.to(dtype), so RoPE angles are fp32 in both runs, as in their bf16 training",
        ],
        "versions": versions("transformers"),
        "mapping_to_probe": MAPPING,
        "script": "scripts/authors/value_residual.py",
    }
    print(write_fixture("value-residual", weights=weights, inputs={"input_ids": ids}, outputs=outputs, meta=meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
