"""Golden layer-wise magnitudes of massive activations computed the way Sun et al. 2024's released code does
(locuslab/massive-activations: ``main_llm.py --exp2`` with ``monkey_patch/modify_llama.py``).

    git -C <mirror> archive <commit> main_llm.py monkey_patch lib | tar -x -C /tmp/massive
    /tmp/authors-venv/bin/python scripts/authors/massive.py --src /tmp/massive --commit <commit>

Their statistic (main_llm.py, the ``args.exp2`` branch, lines 81-100; lib/plot_utils_llm.py ``plot_layer_ax`` line 98):
every decoder layer's forward is replaced by ``llama_custom_decoderlayer_forward``, which keeps the layer's output
hidden state as ``layer.feat`` (cloned, ``.double()``); per sequence and layer, ``feat.abs()`` is flattened over
positions and dimensions and sorted descending: the three largest values and ``torch.median(feat_abs)`` fill a
(4, n_layers) array; the plotted numbers are the mean of those arrays over the sequences. Their ``torch.median`` is the
lower of the two middle values for an even count (no interpolation). Their inputs are windows of ``seqlen`` tokens
with ``add_special_tokens=False``; here seeded random ids on a tiny random Llama (common.tiny_llama).

The loop below runs their patched layers and applies their per-sequence reduction step for step (main_llm.py's
``__main__`` block cannot be imported); the reduction is the only code of theirs not executed from their file.
"""

from __future__ import annotations

import contextlib

import numpy as np
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

REPOSITORY = "locuslab/massive-activations"
FILE = "monkey_patch/modify_llama.py"
STATISTIC_FILES = ("main_llm.py", "lib/plot_utils_llm.py")
SEED, N_SEQ, T = 0, 3, 32


@torch.no_grad()
def exp2(mod, model, seqs: torch.Tensor) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """Their exp2 statistic: (per-sequence arrays (N, 4, L): top1, top2, top3, median per layer; their mean (4, L);
    the hidden states it was taken of, every layer's ``feat`` (N, L, T, d) fp64)."""
    layers = model.model.layers
    for layer_id, layer in enumerate(layers):
        mod.enable_llama_custom_decoderlayer(layer, layer_id)
    stats, feats = [], []
    for testseq in seqs:
        model(testseq[None])
        seq_np = np.zeros((4, len(layers)))
        for layer_id in range(len(layers)):
            feat_abs = layers[layer_id].feat.abs()
            sort_res = torch.sort(feat_abs.flatten(), descending=True)
            seq_np[:3, layer_id] = sort_res.values[:3]
            seq_np[3, layer_id] = torch.median(feat_abs)
        stats.append(seq_np)
        feats.append(torch.cat([layer.feat for layer in layers]))  # (L, T, d): their captured layer outputs
    return np.stack(stats), np.mean(stats, axis=0), torch.stack(feats)


def main():
    args = source_parser(__doc__, "folder holding their main_llm.py, monkey_patch/ and lib/ at the commit").parse_args()
    mod = load_module(args.src / FILE, "modify_llama")
    seqs = token_windows(SEED, N_SEQ, T, TINY_LLAMA["vocab_size"])
    outputs, weights = {}, None
    for dtype, prefix in ((torch.float64, ""), (torch.float32, "fp32/")):
        model = tiny_llama(SEED, dtype)
        weights = weights or {k: v.to(torch.float64) for k, v in model.state_dict().items()}
        # transformers' Llama upcasts its norms and eager softmax with .to(torch.float32) / softmax(dtype=fp32)
        with keep_fp64_through_fp32_casts() if dtype == torch.float64 else contextlib.nullcontext():
            per_seq, mean, feat = exp2(mod, model, seqs)
        outputs[f"{prefix}per_sequence"] = torch.from_numpy(per_seq)
        outputs[f"{prefix}mean"] = torch.from_numpy(mean)
        outputs[f"{prefix}feat"] = feat
    meta = {
        "repository": REPOSITORY,
        "commit": args.commit,
        "file": FILE,
        "blob": git_blob_sha1(args.src / FILE),
        "statistic_files": {f: git_blob_sha1(args.src / f) for f in STATISTIC_FILES},
        "statistic": "main_llm.py --exp2 (lines 81-100) per sequence: sort |layer output| over T x d descending, "
        "top 3 and torch.median (lower middle value); plot_utils_llm.plot_layer_ax: mean over sequences",
        "settings": {
            "model": "transformers LlamaForCausalLM, eager attention",
            **TINY_LLAMA,
            "seed": SEED,
            "n_sequences": N_SEQ,
            "seq_len": T,
            "bos": False,
        },
        "mapping": {
            "weights": "HF Llama names, loaded as they are into the same transformers model, wrapped by "
            "probe's llama adapter",
            "their layer l (1-based, the output of decoder layer l-1)": "probe's massive layer l: "
            "blocks.{l}.hook_resid_pre for l < L, blocks.{L-1}.hook_resid_post for l = L; probe's layer 0 "
            "(the embedding) they do not report",
            "outputs per_sequence[n, k, l]": "k = 0, 1, 2: top1..top3, k = 3: their median",
            "outputs feat[n, l]": "the hidden state their statistic reads (layer l's output, (T, d))",
        },
        "versions": versions("transformers"),
        "patches": [
            KEEP_FP64_CASTS_PATCH + " (transformers' LlamaRMSNorm and eager softmax; its RoPE table stays "
            "fp32 as in probe's run of the same transformers model); their own code casts the layer output "
            ".double()"
        ],
    }
    write_fixture("massive", weights=weights, inputs={"input_ids": seqs}, outputs=outputs, meta=meta)


if __name__ == "__main__":
    main()
