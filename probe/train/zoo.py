"""The model zoo: tiny-tier variants trained here with one seed on the same bundled data, shipped in probe/zoo/.

    python -m probe.train.zoo --variants baseline sink+proj --steps 600 [--jobs 2] [--work runs/zoo]
    python -m probe.train.zoo --data hf:fineweb-edu:200000 --steps 32768 --device cuda --zoo-dir my-zoo   # online

Each shipped checkpoint directory holds the fp16 safetensors weights, config, tokenizer and `zoo.json`: the exact
command line, the training recipe, the evaluation batches (corpus, seed, shape) and the validation loss measured on
the shipped (fp16) weights in fp32 on the CPU, so a test can reload it anywhere and reproduce that number.

``--jobs N`` trains N variants at once in separate processes (on CPU each gets cores/N threads: two one-thread jobs
train 6.4k tokens/s together on 2 cores, one two-thread job 5.4k; on a GPU they share the device). An ``hf:`` corpus
is fetched once, into WORK/corpus.jsonl.gz, for all of them. Training runs keep resumable checkpoints (and
``--snapshot-every`` snapshots) under ``--work``; a rerun of the same command resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from probe.runs import ZOO_DIR

ZOO_VARIANTS = [
    "baseline",
    "sinklogit",
    "normgate",
    "projgate",
    "sink+norm",
    "sink+proj",
    "gatedv",
    "attnres-block4",
    "slr-block4-r32",
    "plr-block4-r32",
    "value-residual",
    "mudd",
]
DEFAULT_MODEL = "probe/tiny-sink+proj"  # the CLI's embedded default
RECIPE = dict(tier="tiny", seed=0, data="train", tokenizer="probe-bpe-8k", batch_size=8, ctx=256, lr=3e-3, warmup=60)
EVAL = dict(corpus="wikitext-2-test", n_batches=4, batch_size=8, ctx=256, seed=0, mode="sequential")


def zoo_eval_batches(tokenizer, spec: dict = EVAL):
    from probe.data import eval_batches

    return eval_batches(
        spec["corpus"],
        tokenizer,
        n_batches=spec["n_batches"],
        batch_size=spec["batch_size"],
        ctx=spec["ctx"],
        seed=spec["seed"],
        mode=spec["mode"],
    )


def train_variant(
    variant: str,
    steps: int,
    work: Path,
    docs,
    tokenizer,
    command: str,
    progress=True,
    *,
    recipe: dict = RECIPE,
    device: str = "auto",
    snapshot_every: int = 0,
    zoo_dir: Path = ZOO_DIR,
) -> dict:
    import torch

    from probe.data import WindowSampler
    from probe.models import create
    from probe.train.trainer import TrainConfig, evaluate, train

    r = recipe
    model = create(variant, r["tier"], seed=r["seed"])
    sampler = WindowSampler(docs, r["ctx"], seed=r["seed"], eos_id=tokenizer.eos_token_id)
    cfg = TrainConfig(
        steps=steps,
        batch_size=r["batch_size"],
        lr=r["lr"],
        warmup=r["warmup"],
        eval_every=0,
        ckpt_every=100,
        log_every=20,
        seed=r["seed"],
        device=device,
        snapshot_every=snapshot_every,
    )
    last = train(model, sampler, cfg, work / variant, progress=progress, tokenizer=tokenizer)

    name = f"{r['tier']}-{variant}"
    from probe.writes import atomic_write, staging_dir

    tmp, final = staging_dir(zoo_dir, name), zoo_dir / name  # a new folder of a random name: never a planted one
    model.cpu().half().save_pretrained(tmp)  # shipped in fp16; analyses run it in fp32
    tokenizer.save_pretrained(tmp)
    from transformers import AutoModelForCausalLM

    shipped = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)  # on the CPU, wherever it trained
    val = evaluate(shipped, zoo_eval_batches(tokenizer))
    record = {
        "name": f"probe/{name}",
        "variant": variant,
        "command": command,
        "recipe": {**r, "steps": steps},
        "train_metrics": last,
        "eval": EVAL,
        "val_loss": val,
    }
    atomic_write(tmp / "zoo.json", json.dumps(record, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return record


def _run_parallel(args, argv_of) -> int:
    """Train ``args.variants`` in ``args.jobs`` child processes at a time; each logs to WORK/<variant>.log."""
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    args.work.mkdir(parents=True, exist_ok=True)
    pending, running, failed = list(args.variants), {}, []
    while pending or running:
        while pending and len(running) < args.jobs:
            v = pending.pop(0)
            log = open(args.work / f"{v}.log", "w")
            cmd = [sys.executable, "-m", "probe.train.zoo", *argv_of(v), "--quiet"]
            running[v] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log)
            print(f"started {v} ({threads} thread{'s' * (threads > 1)}; log {args.work / f'{v}.log'})", flush=True)
        time.sleep(2)
        for v, (proc, log) in list(running.items()):
            if proc.poll() is not None:
                log.close()
                del running[v]
                tail = (args.work / f"{v}.log").read_text().strip().splitlines()[-1:] or ["(no output)"]
                print(
                    f"{v}: {'done' if proc.returncode == 0 else f'FAILED ({proc.returncode})'}: {tail[0]}", flush=True
                )
                if proc.returncode:
                    failed.append(v)
    if failed:
        print(f"failed: {' '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Train and ship the tiny-tier zoo")
    ap.add_argument("--variants", nargs="+", default=ZOO_VARIANTS)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument(
        "--data",
        default=RECIPE["data"],
        help="training corpus: 'train' (the bundled mix), a .txt or .jsonl[.gz] file, a directory, hf:fineweb-edu[:N]",
    )
    ap.add_argument("--batch-size", type=int, default=RECIPE["batch_size"], help="windows per step")
    ap.add_argument("--lr", type=float, default=RECIPE["lr"], help="peak learning rate")
    ap.add_argument("--warmup", type=int, default=RECIPE["warmup"], help="warmup steps")
    ap.add_argument("--jobs", type=int, default=1, help="variants trained at once, in separate processes")
    ap.add_argument("--device", default="auto", help="cpu, cuda, ... (default: cuda if available)")
    ap.add_argument("--snapshot-every", type=int, default=0, help="keep snapshots in WORK/<variant>/snapshots")
    ap.add_argument("--work", type=Path, default=Path("runs/zoo"), help="training checkpoints (resumable)")
    ap.add_argument("--zoo-dir", type=Path, default=ZOO_DIR, help="where the trained checkpoints go (default: the zoo)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--record-data", help=argparse.SUPPRESS)  # child processes: the --data the user gave
    return ap


def _recipe_of(args) -> dict:
    """RECIPE with the flags' values; ``data`` is the --data the user gave (a child process is told it)."""
    return {
        **RECIPE,
        "data": args.record_data or args.data,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "warmup": args.warmup,
    }


def _variant_argv(args, recipe: dict, variant: str) -> list[str]:
    """The command that trains one variant (recorded in its zoo.json): the recipe's flags that differ from RECIPE."""
    extra = [
        (f"--{k.replace('_', '-')}", recipe[k])
        for k in ("data", "batch_size", "lr", "warmup")
        if recipe[k] != RECIPE[k]
    ]
    return ["--variants", variant, "--steps", str(args.steps), *[str(x) for kv in extra for x in kv]]


def _child_argv(args, recipe: dict, data: str, variant: str) -> list[str]:
    """A child process's command line: one variant, reading ``data`` and recording the user's --data."""
    return [
        *_variant_argv(args, recipe, variant),
        "--data",
        data,
        "--record-data",
        recipe["data"],
        "--work",
        str(args.work),
        "--device",
        args.device,
        "--snapshot-every",
        str(args.snapshot_every),
        "--zoo-dir",
        str(args.zoo_dir),
    ]


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    from probe.models import config_for

    for v in args.variants:
        try:
            config_for(v, RECIPE["tier"])
        except ValueError as e:
            ap.error(f"--variants {v!r}: {e}")
    recipe = _recipe_of(args)
    from probe.data import load_corpus, load_tokenizer, tokenize_documents
    from probe.data.corpus import write_jsonl

    try:  # read here first, so that a bad --data is one error rather than one per child process
        corpus = load_corpus(args.data)
    except (ValueError, FileNotFoundError, ConnectionError, ImportError) as e:
        ap.error(f"--data {args.data!r}: {e}")
    if args.jobs > 1 and len(args.variants) > 1:
        data = args.data
        if data.startswith("hf:"):  # fetched once here; the children read this copy and record the hf: name
            data = str(write_jsonl(corpus.documents, args.work / "corpus.jsonl.gz"))
        return _run_parallel(args, lambda v: _child_argv(args, recipe, data, v))
    tokenizer = load_tokenizer(RECIPE["tokenizer"])
    docs = tokenize_documents(corpus, tokenizer)
    for variant in args.variants:
        command = "python -m probe.train.zoo " + shlex.join(_variant_argv(args, recipe, variant))
        rec = train_variant(
            variant,
            args.steps,
            args.work,
            docs,
            tokenizer,
            command,
            progress=not args.quiet,
            recipe=recipe,
            device=args.device,
            snapshot_every=args.snapshot_every,
            zoo_dir=args.zoo_dir,
        )
        print(f"{rec['name']}: val_loss {rec['val_loss']:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
