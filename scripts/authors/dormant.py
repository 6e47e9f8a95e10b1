"""Golden active/dormant statistics computed the way Guo et al. 2024's released code does
(GuoTianYu2000/Active-Dormant-Attention: ``LLM/src/entropy.py`` and ``BBM/probe_utils.py``).

    git -C <mirror> archive <commit> LLM/src/entropy.py BBM/probe_utils.py | tar -x -C /tmp/dormant
    /tmp/authors-venv/bin/python scripts/authors/dormant.py --src /tmp/dormant --commit <commit>

Their code states no attention-on-BOS threshold. It measures a head's sink behaviour two ways:
  bos_attn   BBM/probe_utils.py ``get_dynamic_summary`` (lines 287-288): ``attn_weights[:, 0, :, 0][~triggers_pos]
             .mean()``, the mass on key 0 averaged over **every** query row, row 0 included (whose whole mass is on
             key 0), over the non-trigger positions of the batch, for their one-head models' head 0. Here per
             (sequence, layer, head) with no trigger positions (natural text has none): the mean over rows t = 0..T-1.
  entropies  LLM/src/entropy.py, which their ``*WithEntropyDetectionHook`` hooks (LLM/src/hook.py) threshold to find
             attention-sink heads in LLMs: ``row_headwise_average_normalized_entropy`` (per head, the mean over rows
             of each row's entropy over keys / log(row length); row 0's is 0) and
             ``column_headwise_maximum_normalized_entropy`` (per head, the largest over keys of the entropy of the
             column renormalised / log(column length)); a sink head has low row and high column entropy.
Both are run from their files (entropy.py imported, the bos_attn expression applied as written) on the attention
weights of a tiny random Llama (common.tiny_llama, the weights of the massive fixture) on seeded random ids, no BOS.
"""

from __future__ import annotations

import torch
from common import (
    KEEP_FP64_CASTS_PATCH,
    TINY_LLAMA,
    git_blob_sha1,
    keep_fp64_through_fp32_casts,
    load_module,
    source_parser,
    tiny_llama,
    token_windows,
    versions,
    write_fixture,
)

REPOSITORY = "GuoTianYu2000/Active-Dormant-Attention"
FILE = "LLM/src/entropy.py"
STATISTIC_FILES = ("BBM/probe_utils.py",)
SEED, N_SEQ, T = 0, 3, 32


def bos_attn(attn_weights: torch.Tensor, head: int, triggers_pos: torch.Tensor) -> torch.Tensor:
    """BBM/probe_utils.py line 288's expression for one head (theirs: head 0): the mean of column 0 over the rows
    that are not trigger positions; attn_weights (B, H, T, T), triggers_pos (B, T) bool."""
    return attn_weights[:, head, :, 0][~triggers_pos].mean()


@torch.no_grad()
def main():
    args = source_parser(__doc__, "folder holding their LLM/src/entropy.py and BBM/probe_utils.py").parse_args()
    ent = load_module(args.src / FILE, "guo_entropy")
    seqs = token_windows(SEED, N_SEQ, T, TINY_LLAMA["vocab_size"])
    model = tiny_llama(SEED, torch.float64)
    with keep_fp64_through_fp32_casts():  # transformers' LlamaRMSNorm and eager softmax upcast to fp32
        attentions = torch.stack(model(seqs, output_attentions=True).attentions, 1)  # (N, L, H, T, T)
    N, L, H = attentions.shape[:3]
    no_triggers = torch.zeros(1, T, dtype=torch.bool)
    outputs = {
        "attentions": attentions,
        "bos_attn": torch.tensor(
            [
                [[float(bos_attn(attentions[n, l][None], h, no_triggers)) for h in range(H)] for l in range(L)]
                for n in range(N)
            ],
            dtype=torch.float64,
        ),  # (N, L, H)
        "row_entropy": torch.stack(
            [ent.row_headwise_average_normalized_entropy(attentions[:, l]) for l in range(L)], 1
        ),  # (N, L, H)
        "column_entropy": torch.stack(
            [ent.column_headwise_maximum_normalized_entropy(attentions[:, l]) for l in range(L)], 1
        ),
    }
    meta = {
        "repository": REPOSITORY,
        "commit": args.commit,
        "file": FILE,
        "blob": git_blob_sha1(args.src / FILE),
        "statistic_files": {f: git_blob_sha1(args.src / f) for f in STATISTIC_FILES},
        "statistic": "bos_attn: BBM/probe_utils.py:288 per (sequence, layer, head), no trigger positions (mean of "
        "A[:, 0] over rows 0..T-1); row_entropy / column_entropy: LLM/src/entropy.py headwise functions",
        "settings": {
            "model": "transformers LlamaForCausalLM, eager attention, output_attentions",
            **TINY_LLAMA,
            "seed": SEED,
            "n_sequences": N_SEQ,
            "seq_len": T,
            "bos": False,
        },
        "mapping": {
            "weights": "HF Llama names (the same as tests/fixtures/authors/massive/weights.safetensors), "
            "wrapped by probe's llama adapter",
            "outputs [n, l, h]": "window n, layer l, query head h: probe's dormant inputs row (batch n, "
            "layer l, head h)",
        },
        "versions": versions("transformers"),
        "patches": [KEEP_FP64_CASTS_PATCH + " (transformers' LlamaRMSNorm and eager softmax; RoPE table fp32)"],
    }
    weights = {k: v.to(torch.float64) for k, v in model.state_dict().items()}
    write_fixture("dormant", weights=weights, inputs={"input_ids": seqs}, outputs=outputs, meta=meta)


if __name__ == "__main__":
    main()
