"""Golden Sink^eps numbers of Gemma 3 270M under Gu et al.'s protocol (sail-sg/Attention-Sink eval_sink_open_source.py).

Runs outside the product: plain transformers + torch, the converted Gemma 3 270M directory (probe's GGUF cache,
``probe.checkpoints.gguf.gemma_model_dir()``, or ``--model-dir``), eager attention, ``output_attentions``. Gu et al.'s
own two functions are imported from their file (``--src``, at the pinned ``--commit``) and run as published:
``measure_attention_sink`` (tokenize each text with the tokenizer's default special tokens, keep the first 64 ids,
``model.generate(..., output_attentions=True, max_new_tokens=1)``, save the (samples, layers, heads, 64, 64) attentions
as .npy) and ``compute_attention_sink`` (score of key k = Σ_i A[i, k] / (64 − k), the mean over queries i >= k;
indicator score > eps per sample; mean over samples, layers and heads, in %). Their Sink^eps is that vector's entry for
key 0. Beside theirs, this script computes the same number its own way (α0 = mean over i = 0..63 of A[i, 0] per sample,
layer and head; the mean of α0 > eps) and stops if the two differ.

Inputs (three domains, ``--n`` each):
- natural: the first n documents of probe's bundled WikiText-2 test split (``probe.data.load_corpus``, the texts only)
  whose encoding with the tokenizer's special tokens holds >= 65 tokens (64 read and one more, probe's rule; Gu et
  al. assert >= 64; every article here has thousands);
- random: ``torch.randint(0, V, (n, 65), generator=torch.Generator().manual_seed(seed))``, V = the model's vocabulary;
- repeat: one id per sequence, ``torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))``, repeated.
Gu et al.'s released code builds natural inputs only; the random and repeated ones follow the paper (§3.1) with no BOS
(see docs/definitions.md#token-domains). Their measuring function tokenizes text, so the synthetic ids reach it through
a stand-in tokenizer that returns the ids it is given (recorded in the fixture as the one patch).

Writes tests/fixtures/authors/gu2025/gemma-3-270m.json: per domain the per (layer, head) mean α0 over samples, the
Sink^eps percentages per eps (theirs), the input ids of the synthetic domains (the first 64 of each), the natural
documents' indices, and the provenance (repository, commit, file and its git blob id, versions, settings). CPU, fp32,
one thread: about a minute.

    python scripts/authors/gu2025_sink_eps.py --src /path/to/Attention-Sink/eval_sink_open_source.py \
        --commit af49727230ee57b6ecadcc74547653fc776833fc
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import FIXTURES, git_blob_sha1, load_module, source_parser  # noqa: E402

REPOSITORY = "sail-sg/Attention-Sink"
FILE = "eval_sink_open_source.py"
TOKENS = 64  # their token_length
EPS = (0.1, 0.3, 0.5)


class IdsTokenizer:
    """Stands in for the tokenizer in Gu et al.'s measuring function for the synthetic domains: the 'prompt' is a row of
    ids and comes back as the encoding (their function then cuts it to the first 64, as for text)."""

    def __call__(self, ids, return_tensors="pt"):
        from transformers import BatchEncoding

        x = torch.as_tensor(ids, dtype=torch.long)[None]
        return BatchEncoding({"input_ids": x, "attention_mask": torch.ones_like(x)})


def own_sink_eps(attn: np.ndarray, eps: float) -> tuple[np.ndarray, float]:
    """This script's reading of the metric: α0 (samples, layers, heads) = mean over queries 0..63 of A[i, 0]; returns
    (α0, 100 · mean of the indicator α0 > eps)."""
    alpha0 = attn[..., :, 0].astype(np.float64).mean(-1)
    return alpha0, float((alpha0 > eps).mean() * 100)


def main() -> None:
    ap = source_parser(__doc__, "Gu et al.'s eval_sink_open_source.py (from the pinned commit)")
    ap.add_argument("--model-dir", type=Path, help="converted Gemma 3 270M (default: probe's GGUF cache)")
    ap.add_argument("--n", type=int, default=32, help="samples per domain (default 32)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=FIXTURES / "gu2025" / "gemma-3-270m.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    theirs = load_module(args.src, "gu2025_eval_sink")
    model_dir = args.model_dir
    if model_dir is None:
        from probe.checkpoints.gguf import gemma_model_dir  # only to find the converted directory

        model_dir = gemma_model_dir()
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    V = model.config.vocab_size

    from probe.data import load_corpus  # the bundled texts only (their split into articles and their fingerprint)

    corpus = load_corpus("wikitext-2-test")
    natural, doc_ids = [], []
    for i, text in enumerate(corpus.documents):
        if len(tokenizer(text)["input_ids"]) >= TOKENS + 1:
            natural.append(text)
            doc_ids.append(i)
        if len(natural) == args.n:
            break
    random_ids = torch.randint(0, V, (args.n, TOKENS + 1), generator=torch.Generator().manual_seed(args.seed))
    repeat_one = torch.randint(0, V, (args.n,), generator=torch.Generator().manual_seed(args.seed))
    repeat_ids = repeat_one[:, None].expand(args.n, TOKENS + 1)
    domains = {
        "natural": (natural, tokenizer),
        "random": ([r.tolist() for r in random_ids], IdsTokenizer()),
        "repeat": ([r.tolist() for r in repeat_ids], IdsTokenizer()),
    }

    out = {
        "repository": REPOSITORY,
        "commit": args.commit,
        "file": FILE,
        "file_blob": git_blob_sha1(args.src),
        "functions": ["measure_attention_sink", "compute_attention_sink"],
        "patch": "synthetic domains reach measure_attention_sink through a tokenizer stand-in that returns the ids",
        "model": "gemma-3-270m",
        "model_dir_config": json.loads((Path(model_dir) / "config.json").read_text())["_model_name_or_path"],
        "vocab_size": V,
        "settings": {
            "token_length": TOKENS,
            "eps": list(EPS),
            "n": args.n,
            "seed": args.seed,
            "dtype": "float32",
            "attn_implementation": "eager",
            "device": "cpu",
            "threads": 1,
            "natural": "first n wikitext-2-test documents of >= 65 tokens (tokenizer default special "
            "tokens), corpus order",
            "random": "torch.randint(0, V, (n, 65), generator=torch.Generator().manual_seed(seed))",
            "repeat": "torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed)), repeated",
            "bos": "natural: the tokenizer's (<bos>); random / repeat: none",
        },
        "corpus": corpus.name,
        "corpus_fingerprint": corpus.fingerprint,
        "natural_documents": doc_ids,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": importlib.metadata.version("transformers"),
            "numpy": np.__version__,
        },
        "domains": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, (prompts, tok) in domains.items():
            t0 = time.perf_counter()
            path = Path(tmp) / f"{name}.npy"
            with torch.no_grad():
                theirs.measure_attention_sink(model, tok, prompts, str(path), TOKENS, torch.device("cpu"))
            attn = np.load(path)  # (samples, layers, heads, 64, 64)
            row = {"percent": {}}
            for e in EPS:
                metric = theirs.compute_attention_sink(str(path), epsilon=e)  # (64,) % per key position
                alpha0, mine = own_sink_eps(attn, e)
                if abs(float(metric[0]) - mine) > 1e-4:
                    raise SystemExit(f"{name} eps={e}: their Sink^eps {float(metric[0])} != this script's {mine}")
                row["percent"][f"{e:g}"] = float(metric[0])
            row["alpha0_mean"] = alpha0.mean(0).tolist()  # (layers, heads): mean over samples of α0
            if name != "natural":
                row["input_ids"] = [p[:TOKENS] for p in prompts]
            out["domains"][name] = row  # no wall times in the file: a rerun rewrites it byte for byte
            print(
                f"{name}: Sink^eps % "
                + ", ".join(f"eps {k}: {v:.2f}" for k, v in row["percent"].items())
                + f" ({time.perf_counter() - t0:.1f} s)"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
