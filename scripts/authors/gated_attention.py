"""Golden outputs of Gated Attention's G1 output gate (qiuzh20/gated_attention ``modeling_qwen3.py``).

    mkdir -p /tmp/qiu/qwen3_gated && git -C <mirror> archive <commit> modeling_qwen3.py configuration_qwen3.py \
        | tar -x -C /tmp/qiu/qwen3_gated
    /tmp/authors-venv/bin/python scripts/authors/gated_attention.py --src /tmp/qiu/qwen3_gated --commit <commit>

Their ``Qwen3ForCausalLM`` with ``elementwise_attn_output_gate`` and, separately, ``headwise_attn_output_gate`` (the
gate rows are extra output rows of q_proj, split off per KV head before the QK-norm and RoPE; the SDPA output is
multiplied by their sigmoid before o_proj) at a tiny size with grouped-query attention (4 query heads on 2 KV heads,
so the split's per-KV-head layout matters), seeded random weights, eager attention, one batch in fp64 and in fp32:
logits, each layer's output and attention weights. Their two files import each other relatively, so ``--src`` is the
folder holding both (imported as a namespace package named after the folder, which must not be
``gated_attention``, this script's own name). Writes
tests/fixtures/authors/gated-attention-elementwise/ and gated-attention-headwise/.
"""

from __future__ import annotations

import contextlib
import importlib
import sys

import torch
from common import (
    KEEP_FP64_CASTS_PATCH,
    git_blob_sha1,
    keep_fp64_through_fp32_casts,
    randomize,
    source_parser,
    versions,
    write_fixture,
)

REPOSITORY = "qiuzh20/gated_attention"
FILE = "modeling_qwen3.py"
SETTINGS = dict(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=4,
    max_position_embeddings=16,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    use_qk_norm=True,
    qkv_bias=False,  # read by their Qwen3Attention, not defined by their Qwen3Config
    attn_implementation="eager",
)
FORMS = {"elementwise": "elementwise_attn_output_gate", "headwise": "headwise_attn_output_gate"}
SEED, BATCH, T = 0, 2, 8
MAPPING = {
    "model.embed_tokens.weight": "embed.weight",
    "model.layers.{l}.self_attn.q_proj.weight": "per KV head g (rows in blocks of G*dh + G*w, w = dh element-wise "
    "or 1 headwise): the first G*dh rows -> blocks.{l}.attn.q_proj.weight rows of query heads g*G .. g*G+G-1, the "
    "last G*w -> blocks.{l}.attn.out_gate.proj.weight rows of the same heads",
    "model.layers.{l}.self_attn.{k,v,o}_proj.weight": "blocks.{l}.attn.{k,v,o}_proj.weight (both rotate-half RoPE)",
    "model.layers.{l}.self_attn.{q,k}_norm.weight": "blocks.{l}.attn.{q,k}_norm.weight",
    "model.layers.{l}.mlp.{gate,up,down}_proj.weight": "blocks.{l}.mlp.{gate,up,down}.weight",
    "model.layers.{l}.input_layernorm.weight / post_attention_layernorm.weight": "blocks.{l}.ln1.weight / ln2.weight",
    "model.norm.weight": "ln_f.weight",
    "lm_head.weight": "lm_head.weight",
}


def run(mod, cfg_mod, form: str, weights: dict, ids: torch.Tensor, dtype) -> dict:
    config = cfg_mod.Qwen3Config(**SETTINGS, **{FORMS[form]: True})
    model = mod.Qwen3ForCausalLM(config).to(dtype).eval()
    model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=True)
    for m in model.modules():  # RoPE frequencies stay as their init made them (fp32), whatever the model's dtype
        if isinstance(m, mod.Qwen3RotaryEmbedding):
            m.inv_freq = m.original_inv_freq = m.inv_freq.float()
    with torch.no_grad(), contextlib.ExitStack() as stack:
        if dtype == torch.float64:
            stack.enter_context(keep_fp64_through_fp32_casts())
        out = model(ids, output_hidden_states=True, output_attentions=True)
    L = SETTINGS["num_hidden_layers"]
    res = {"logits": out.logits}
    res.update({f"resid_post.{l}": out.hidden_states[l + 1] for l in range(L - 1)})
    res.update({f"pattern.{l}": out.attentions[l] for l in range(L)})
    return {k: v.to(dtype) for k, v in res.items()}


def main(argv=None) -> int:
    ap = source_parser(__doc__, "the folder holding their modeling_qwen3.py and configuration_qwen3.py")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(args.src.resolve().parent))
    package = args.src.resolve().name
    mod = importlib.import_module(f"{package}.modeling_qwen3")
    cfg_mod = importlib.import_module(f"{package}.configuration_qwen3")
    ids = torch.randint(0, SETTINGS["vocab_size"], (BATCH, T), generator=torch.Generator().manual_seed(SEED + 1))
    for form in FORMS:
        model = mod.Qwen3ForCausalLM(cfg_mod.Qwen3Config(**SETTINGS, **{FORMS[form]: True})).double()
        randomize(model, SEED, skip={n for n, _ in model.named_parameters() if "norm" in n})  # norms: their ones
        weights = {k: v.clone() for k, v in model.state_dict().items() if "rotary_emb" not in k}
        outputs = run(mod, cfg_mod, form, weights, ids, torch.float64)
        outputs.update({f"fp32/{k}": v for k, v in run(mod, cfg_mod, form, weights, ids, torch.float32).items()})
        meta = {
            "repository": REPOSITORY,
            "commit": args.commit,
            "file": FILE,
            "file_blob_sha1": git_blob_sha1(args.src / FILE),
            "config_blob_sha1": git_blob_sha1(args.src / "configuration_qwen3.py"),
            "entry": f"Qwen3ForCausalLM(Qwen3Config(**settings, {FORMS[form]}=True)).eval()(input_ids, "
            "output_hidden_states=True, output_attentions=True)",
            "form": form,
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
                "each Qwen3RotaryEmbedding.inv_freq is kept in fp32 (as their init computes it) after "
                "model.to(dtype), so RoPE angles are fp32 in both runs, as in their bf16 training",
            ],
            "versions": versions("transformers"),
            "mapping_to_probe": MAPPING,
            "script": "scripts/authors/gated_attention.py",
        }
        print(
            write_fixture(
                f"gated-attention-{form}", weights=weights, inputs={"input_ids": ids}, outputs=outputs, meta=meta
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
