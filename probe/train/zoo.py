"""The model zoo: tiny-tier variants trained here with one seed on the same bundled data, shipped in probe/zoo/.

    python -m probe.train.zoo --variants baseline sink+proj --steps 600 [--work runs/zoo]

Each shipped checkpoint directory holds the fp16 safetensors weights, config, tokenizer and `zoo.json`: the exact
command line, the training recipe, the evaluation batches (corpus, seed, shape) and the validation loss measured on
the shipped (fp16) weights, so a test can reload it and reproduce that number.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent.parent / "zoo"
ZOO_VARIANTS = ["baseline", "sinklogit", "normgate", "projgate", "sink+norm", "sink+proj", "gatedv", "attnres-block4",
                "slr-block4-r32", "plr-block4-r32", "value-residual", "mudd"]
DEFAULT_MODEL = "probe/tiny-sink+proj"  # the CLI's embedded default
RECIPE = dict(tier="tiny", seed=0, data="train", tokenizer="probe-bpe-8k", batch_size=8, ctx=256, lr=3e-3, warmup=60)
EVAL = dict(corpus="wikitext-2-test", n_batches=4, batch_size=8, ctx=256, seed=0, mode="sequential")


def zoo_eval_batches(tokenizer, spec: dict = EVAL):
    from probe.data import eval_batches

    return eval_batches(spec["corpus"], tokenizer, n_batches=spec["n_batches"], batch_size=spec["batch_size"],
                        ctx=spec["ctx"], seed=spec["seed"], mode=spec["mode"])


def train_variant(variant: str, steps: int, work: Path, docs, tokenizer, command: str, progress=True) -> dict:
    import torch

    from probe.data import WindowSampler
    from probe.models import create
    from probe.train.trainer import TrainConfig, evaluate, train

    r = RECIPE
    model = create(variant, r["tier"], seed=r["seed"])
    sampler = WindowSampler(docs, r["ctx"], seed=r["seed"], eos_id=tokenizer.eos_token_id)
    cfg = TrainConfig(steps=steps, batch_size=r["batch_size"], lr=r["lr"], warmup=r["warmup"], eval_every=0,
                      ckpt_every=100, log_every=20, seed=r["seed"])
    last = train(model, sampler, cfg, work / variant, progress=progress)

    name = f"{r['tier']}-{variant}"
    tmp, final = ZOO_DIR / f".{name}.tmp", ZOO_DIR / name
    shutil.rmtree(tmp, ignore_errors=True)
    model.half().save_pretrained(tmp)  # shipped in fp16; analyses run it in fp32
    tokenizer.save_pretrained(tmp)
    from transformers import AutoModelForCausalLM

    shipped = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    val = evaluate(shipped, zoo_eval_batches(tokenizer))
    record = {"name": f"probe/{name}", "variant": variant, "command": command, "recipe": {**r, "steps": steps},
              "train_metrics": last, "eval": EVAL, "val_loss": val}
    (tmp / "zoo.json").write_text(json.dumps(record, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return record


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Train and ship the tiny-tier zoo")
    ap.add_argument("--variants", nargs="+", default=ZOO_VARIANTS)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--work", type=Path, default=Path("runs/zoo"), help="training checkpoints (resumable)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    from probe.data import load_corpus, load_tokenizer, tokenize_documents

    tokenizer = load_tokenizer(RECIPE["tokenizer"])
    docs = tokenize_documents(load_corpus(RECIPE["data"]), tokenizer)
    for variant in args.variants:
        command = "python -m probe.train.zoo " + shlex.join(["--variants", variant, "--steps", str(args.steps)])
        rec = train_variant(variant, args.steps, args.work, docs, tokenizer, command, progress=not args.quiet)
        print(f"{rec['name']}: val_loss {rec['val_loss']:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
