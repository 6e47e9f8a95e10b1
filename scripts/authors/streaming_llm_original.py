"""The check of streaming_llm.py's port: StreamingLLM's position-shift attention run **unported**, on the transformers
their README pins (4.33.0), on the weights and stream of tests/fixtures/authors/streaming-llm/{llama,gpt-neox}.

    python3.11 -m venv /tmp/sllm-venv && /tmp/sllm-venv/bin/pip install -r scripts/authors/requirements.txt \
        && /tmp/sllm-venv/bin/pip install --no-deps transformers==4.33.0 tokenizers==0.13.3
    /tmp/sllm-venv/bin/python scripts/authors/streaming_llm_original.py --src /tmp/streaming-llm --commit <commit>

(run after streaming_llm.py, which writes the weights). Their files are imported as published: kv_cache.py's
StartRecentKVCache, modify_llama.py / modify_gpt_neox.py's enable functions with their own forwards, and their loop
(eval_long_ppl.py lines 70-90) line for line, with transformers 4.33's tuple caches (no conversion). The three modes
and the outputs are streaming_llm.py's; they go to ``transformers-4.33.safetensors`` beside its outputs, and
tests/analyses/test_streaming_llm_authors.py checks the port against them.

fp64 patches (the fp32 run is unpatched): KEEP_FP64_CASTS_PATCH; KEEP_FP64_PATCH (4.33's LlamaForCausalLM returns
``logits.float()``); the rotary tables rebuilt from fp64 angles after the cast to fp64 (4.33 builds them once at init
in the default dtype; streaming_llm.py's FP64_ROTARY_PATCH).
"""

from __future__ import annotations

import contextlib
import json

import torch
from common import (
    FIXTURES,
    KEEP_FP64_CASTS_PATCH,
    KEEP_FP64_PATCH,
    contiguous,
    git_blob_sha1,
    keep_fp64_through_float,
    keep_fp64_through_fp32_casts,
    source_parser,
    versions,
)
from safetensors.torch import load_file, save_file
from streaming_llm import FILES, FP64_ROTARY_PATCH, LOGIT_ROWS, REPOSITORY, load_theirs, run_modes


def hf_model(family: str, config: dict, weights: dict, dtype):
    """The fixture's weights in transformers 4.33's model (its names for GPT-NeoX: rotary_pct, rotary_emb_base, and
    embed_out for the unembedding, lm_head in 5.24)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**config))
    else:
        rope = config["rope_parameters"]
        config = {k: v for k, v in config.items() if k != "rope_parameters"}
        model = GPTNeoXForCausalLM(
            GPTNeoXConfig(**config, rotary_pct=rope["partial_rotary_factor"], rotary_emb_base=rope["rope_theta"])
        )
        weights = {"embed_out.weight" if k == "lm_head.weight" else k: v for k, v in weights.items()}
    model = model.to(torch.float64)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and all(k.endswith(".inv_freq") for k in missing), (missing, unexpected)
    return model.to(dtype).eval()


def fp64_tables(model) -> None:
    """Rebuild every rotary table of an fp64 model from fp64 angles."""
    for m in model.modules():
        if type(m).__name__ == "LlamaRotaryEmbedding":
            m._set_cos_sin_cache(seq_len=m.max_seq_len_cached, device=m.inv_freq.device, dtype=torch.float64)
        elif type(m).__name__ == "GPTNeoXRotaryEmbedding":
            m._set_cos_sin_cache(seq_len=m.max_seq_len_cached, device=m.inv_freq.device)


@torch.no_grad()
def eval_long_ppl(model, ids: torch.Tensor, kv_cache) -> dict:
    """eval_long_ppl.py's loop as published (per-token NLLs, the logits of LOGIT_ROWS, each step's query position)."""
    loss_fn = torch.nn.CrossEntropyLoss(reduction="none")
    seen: list[int] = []
    layers = model.base_model.layers
    hook = layers[0].register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(int(kwargs["position_ids"][0, -1])), with_kwargs=True
    )
    nlls, logits_kept, past_key_values = [], [], None
    try:
        for idx in range(0, ids.numel() - 1):
            input_ids = ids[None, idx : idx + 1]
            outputs = model(input_ids, past_key_values=past_key_values, use_cache=True)
            logits = outputs.logits.view(-1, model.config.vocab_size)
            past_key_values = outputs.past_key_values
            label = ids[None, idx + 1 : idx + 2].view(-1)
            neg_log_likelihood = loss_fn(logits, label)
            if kv_cache is not None:
                past_key_values = kv_cache(past_key_values)
            nlls.append(neg_log_likelihood)
            if idx in LOGIT_ROWS:
                logits_kept.append(logits[0])
    finally:
        hook.remove()
    return {"nll": torch.cat(nlls), "logits": torch.stack(logits_kept), "positions": torch.tensor(seen)}


def run_family(family: str, their: dict, config: dict, weights: dict, ids: torch.Tensor, dtype) -> dict:
    plain, shifted = (hf_model(family, config, weights, dtype) for _ in range(2))
    getattr(their[family], f"enable_{family}_pos_shift_attention")(shifted)
    with contextlib.ExitStack() as patches:
        if dtype == torch.float64:
            patches.enter_context(keep_fp64_through_fp32_casts())
            patches.enter_context(keep_fp64_through_float())
            fp64_tables(plain), fp64_tables(shifted)
        return run_modes(their["kv_cache"], plain, shifted, ids, eval_long_ppl)


def main():
    args = source_parser(__doc__, "folder holding their streaming_llm/ and examples/ at the commit").parse_args()
    import transformers

    assert transformers.__version__ == "4.33.0", f"their code is for 4.33.0, not {transformers.__version__}"
    their = load_theirs(args.src)
    torch.set_num_threads(1)
    for family in ("llama", "gpt_neox"):
        root = FIXTURES / "streaming-llm" / family.replace("_", "-")
        meta = json.loads((root / "meta.json").read_text())
        weights, ids = load_file(root / "weights.safetensors"), load_file(root / "inputs.safetensors")["input_ids"][0]
        outputs = run_family(family, their, meta["config"], weights, ids, torch.float64)
        fp32 = run_family(family, their, meta["config"], weights, ids, torch.float32)
        outputs |= {f"fp32/{k}": v for k, v in fp32.items()}
        save_file(contiguous(outputs), root / "transformers-4.33.safetensors")
        record = {
            "repository": REPOSITORY,
            "commit": args.commit,
            "files": {FILES[k]: git_blob_sha1(args.src / FILES[k]) for k in ("kv_cache", family, "loop")},
            "runs": "their files as published: StartRecentKVCache, enable_{family}_pos_shift_attention with their "
            "forward, the eval_long_ppl.py loop with transformers 4.33's tuple caches; weights and ids of meta.json's "
            "fixture (4.33's names for GPT-NeoX: rotary_pct, rotary_emb_base, embed_out.weight for lm_head.weight)",
            "outputs": "as outputs.safetensors (streaming_llm.py's port on transformers 5.24)",
            "versions": versions("transformers"),
            "patches": [
                KEEP_FP64_CASTS_PATCH,
                KEEP_FP64_PATCH,
                FP64_ROTARY_PATCH.replace("transformers 5.24 forms", "transformers 4.33 formed"),
            ],
        }
        (root / "transformers-4.33.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
