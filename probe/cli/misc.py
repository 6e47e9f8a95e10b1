"""The ``probe`` verbs that need no evaluation windows: models, costs, train."""
from __future__ import annotations

import json
import os
from pathlib import Path

from probe.cli.common import (Console, UsageError, check_data, first_line, load_corpus, make_windows, resolve_device,
                              set_threads)
from probe.output import atomic_write, emit, html_page, save_result, show

# ------------------------------------------------------------------------------------------------------------ models


def cmd_models(args) -> int:
    import pandas as pd

    from probe.checkpoints.load import PYTHIA_SIZES, list_models
    from probe.models import TIER_DESCRIPTIONS, TIERS, VARIANTS

    console = Console(args.quiet)
    variants = pd.DataFrame([{"name": k, "description": v} for k, v in VARIANTS.items()])
    tiers = pd.DataFrame([{"name": k, "layers": t["n_layers"], "d_model": t["d_model"], "heads": t["n_heads"],
                           "d_mlp": t["d_mlp"], "ctx": t["n_ctx"], "vocab": t["vocab_size"],
                           "description": TIER_DESCRIPTIONS.get(k, "")} for k, t in TIERS.items()])
    checkpoints = pd.DataFrame(list_models(), columns=["name", "source", "kind", "available"])
    result = {"variants": variants, "tiers": tiers, "checkpoints": checkpoints}
    zoo = checkpoints[checkpoints["kind"] == "zoo"]
    hub = checkpoints[checkpoints["kind"] == "hub"]
    w = max(len(n) for n in list(variants["name"]) + list(tiers["name"]) + list(checkpoints["name"])) + 2
    text = ["variants (probe train --variant V; {N} blocks, {r} routing rank):"]
    text += [f"  {r.name:<{w}}{r.description}" for r in variants.itertuples()]
    text += ["", "tiers (probe train --tier T):"]
    text += [f"  {r.name:<{w}}{r.description}" for r in tiers.itertuples()]
    text += ["", "zoo (bundled trained checkpoints, --model probe/<name>):"]
    text += [f"  {r.name:<{w}}{r.source}" for r in zoo.itertuples()] or ["  none installed yet; commands without "
                                                                         "--model use a freshly initialised tiny model"]
    text += ["", "known checkpoints (--model NAME; 'cached' = in the local Hugging Face cache):"]
    text += [f"  {r.name:<{w}}{r.source}{'  (cached)' if r.available else ''}" for r in hub.itertuples()]
    text += ["", f"  pythia-<size>[-deduped]@step<N>: sizes {', '.join(PYTHIA_SIZES)}; steps 0, 1, 2, 4, ..., 512 "
             "and every 1000 up to 143000", "  also: any HF repo id[@revision], a local model directory, a .gguf file"]
    save_result(args.out, "models", result, [], console, "Models")
    emit(args, "models", result, "\n".join(text))
    return 0


# ------------------------------------------------------------------------------------------------------------ costs


def cmd_costs(args) -> int:
    import pandas as pd

    from probe.analyses.costs import TABLE1, cost_figure, cost_table

    console = Console(args.quiet)
    d, L, m = 1024, 24, 2816
    if args.tier:
        from probe.models import TIERS

        if args.tier not in TIERS:
            raise UsageError(f"--tier {args.tier!r} is not a tier; choose one of {', '.join(TIERS)}")
        t = TIERS[args.tier]
        d, L, m = t["d_model"], t["n_layers"], t["d_mlp"]
    d, L, m = args.d or d, args.layers or L, args.mlp or m
    rows, skipped = [], []
    for meth, N, r, _ in TABLE1:
        if (N is not None and (2 * L) % N) or (r is not None and meth == "s-lr" and r > d):
            skipped.append(f"{meth} N={N} r={r}")
        else:
            rows.append((meth, N, r))
    table = cost_table(d, L, m, rows)
    if (d, L, m) == (1024, 24, 2816):  # the paper's printed values beside the model's
        table["table1_pct"] = [p for meth, N, r, p in TABLE1]
    meta = {"analysis": "costs", "d": d, "L": L, "m": m, "base_flops": int(table["base_flops"].iloc[0])}
    result = {"costs": table, "meta": pd.DataFrame([meta])}
    if skipped:
        console.note(f"skipped rows that do not fit L={L}, d={d}: {', '.join(skipped)}")
    text = [f"cost model: d={d}, L={L}, m={m}; base C = L(4d^2 + 3dm) = {meta['base_flops']:,} multiply-adds/token",
            "", show(table, ["label", "S_src", "added_flops", "added_flops_pct", "table1_pct", "added_params",
                             "added_params_pct"], digits=5)]
    save_result(args.out, "costs", result, [cost_figure(table)], console, "Depth-routing costs")
    emit(args, "costs", result, "\n".join(text))
    return 0


# ------------------------------------------------------------------------------------------------------------ train

RUN_FILE = "probe_train.json"
KILL_ENV = "PROBE_TRAIN_TEST_KILL"  # tests only: SIGKILL this process when step N draws its batch
RUN_KEYS = ("variant", "tier", "seed", "data", "tokenizer", "batch_size", "ctx", "lr", "warmup", "eval_data",
            "eval_batches", "schedule", "min_lr_ratio", "optimizer", "muon_lr", "weight_decay", "grad_clip", "z_loss",
            "grad_accum")  # must match to resume; --steps, --eval-every, --ckpt-every may change
# keys added after runs were written without them: such a run was trained with TrainConfig's defaults for them
LATER_KEYS = ("schedule", "min_lr_ratio", "optimizer", "muon_lr", "weight_decay", "grad_clip", "z_loss", "grad_accum")


def _run_identity(args, ctx: int) -> dict:
    ident = {k: getattr(args, k) for k in RUN_KEYS}
    ident["ctx"] = ctx
    return ident


def _check_run_dir(out: Path, ident: dict) -> bool:
    """True when ``out`` holds a run with the same identity (resume); errors for a different run or foreign files."""
    if not out.exists():
        return False
    if not out.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file, not a run directory")
    run = out / RUN_FILE
    if not run.is_file():
        if any(out.iterdir()):
            raise UsageError(f"--out {str(out)!r} exists and is not a `probe train` run directory; choose a new or "
                             "empty directory")
        return False
    from probe.train import TrainConfig

    old = {**{k: getattr(TrainConfig, k) for k in LATER_KEYS}, **json.loads(run.read_text())}
    diff = [f"--{k.replace('_', '-')} {old.get(k)!r} (now {v!r})" for k, v in ident.items() if old.get(k) != v]
    if diff:
        raise UsageError(f"--out {str(out)!r} holds a run with different settings: {'; '.join(diff)}; resume with "
                         "the same flags or choose another --out")
    return True


def cmd_train(args) -> int:
    from probe.data import WindowSampler, load_tokenizer, tokenize_documents
    from probe.models import config_for, create
    from probe.train import TrainConfig, export_model, find_checkpoint, train
    from probe.train.distributed import from_env

    console = Console(args.quiet)
    check_data(args.data)
    check_data(args.eval_data, "--eval-data")
    try:
        config = config_for(args.variant, args.tier)
    except ValueError as e:
        raise UsageError(f"--variant {args.variant!r} / --tier {args.tier!r}: {first_line(e).split(': ', 1)[-1]}"
                         ) from None
    ctx = args.ctx or config.n_ctx
    if ctx > config.n_ctx:
        raise UsageError(f"--ctx {ctx} exceeds the maximum context {config.n_ctx} of tier {args.tier!r}; choose "
                         f"--ctx 2..{config.n_ctx}")
    if ctx < 2:
        raise UsageError(f"--ctx {ctx} is too short; choose --ctx 2..{config.n_ctx}")
    dist = from_env()  # under torchrun only rank 0 checks, writes and reports
    if args.batch_size % (dist.world_size * args.grad_accum):
        raise UsageError(f"--batch-size {args.batch_size} does not split into {dist.world_size} process(es) x "
                         f"--grad-accum {args.grad_accum} equal micro-batches; choose a --batch-size that is a "
                         f"multiple of {dist.world_size * args.grad_accum}")
    out = Path(args.out)
    ident = _run_identity(args, ctx)
    resuming = _check_run_dir(out, ident) if dist.is_main else False
    set_threads(args.threads)
    device = resolve_device(args.device)
    try:
        tok = load_tokenizer(args.tokenizer)
    except Exception as e:  # noqa: BLE001
        raise UsageError(f"--tokenizer {args.tokenizer!r}: {first_line(e)}") from None
    if len(tok) > config.vocab_size:
        raise UsageError(f"--tokenizer {args.tokenizer!r} has {len(tok)} tokens but tier {args.tier!r} has a "
                         f"vocabulary of {config.vocab_size}; choose a matching tokenizer or tier")
    bar = console.bar(2, f"train: tokenizing {args.data}", unit="corpus", leave=False)
    try:
        docs = tokenize_documents(load_corpus(args.data), tok)
        try:
            sampler = WindowSampler(docs, ctx, args.seed, eos_id=tok.eos_token_id)
        except ValueError as e:
            raise UsageError(f"--data {args.data!r}: {e}") from None
        bar.update()
        bar.set_description(f"train: tokenizing {args.eval_data}")
        eb = make_windows(load_corpus(args.eval_data, "--eval-data"), tok, n_batches=args.eval_batches,
                          batch_size=8, ctx=ctx, seed=args.seed, mode="auto", vocab_size=config.vocab_size)
        bar.update()
    finally:
        bar.close()
    if os.environ.get(KILL_ENV):
        sampler = _KillAt(sampler, int(os.environ[KILL_ENV]))
    model = create(args.variant, args.tier, seed=args.seed)
    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup,
                      schedule=args.schedule, min_lr_ratio=args.min_lr_ratio, optimizer=args.optimizer,
                      muon_lr=args.muon_lr, weight_decay=args.weight_decay, grad_clip=args.grad_clip,
                      z_loss=args.z_loss, grad_accum=args.grad_accum, eval_every=args.eval_every,
                      ckpt_every=args.ckpt_every, snapshot_every=args.snapshot_every, seed=args.seed, device=device)
    n_params = sum(p.numel() for p in model.parameters())
    ckpt = find_checkpoint(out) if resuming else None
    start = json.loads((ckpt / "trainer_state.json").read_text())["step"] if ckpt else 0
    if dist.is_main:
        console.note(f"plan: train {args.tier}-{args.variant} ({n_params:,} parameters) on {args.data} for "
                     f"{args.steps} steps x {args.batch_size} windows x {ctx} tokens"
                     + (f"; resuming from step {start}" if ckpt else "") + f"; run directory {out}")
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / RUN_FILE, json.dumps(ident, indent=1))
    last = train(model, sampler, cfg, out, eval_batches=eb, resume=True, progress=not args.quiet, tokenizer=tok)
    if not dist.is_main:
        return 0
    if start < args.steps or not (out / "model" / "config.json").exists():
        export_model(model, out / "model", tok)
    _write_training_page(out, args, ident)
    result = {**(last or {}), "steps": args.steps, "model_dir": str(out / "model")}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        keys = [k for k in ("step", "loss", "val_loss", "lr", "grad_norm", "tokens", "tokens_per_s") if k in result]
        print("\n".join(f"{k:<14}{result[k]:.4g}" if isinstance(result[k], float) else f"{k:<14}{result[k]}"
                        for k in keys))
        print(f"model saved to {out / 'model'} (probe eval --model {out}); curves in {out / 'training.html'}")
    return 0


def _write_training_page(out: Path, args, ident: dict) -> None:
    """DIR/training.html: the run's settings and curves (loss, validation loss, lr, gradient norm), atomically."""
    from probe.analyses.figures import training_figure
    from probe.train import read_metrics

    page = html_page(f"probe train: {args.tier}-{args.variant} ({out.name})", [training_figure(read_metrics(out))],
                     intro=ident)
    atomic_write(out / "training.html", page)


class _KillAt:
    """Tests only (``PROBE_TRAIN_TEST_KILL=N``): a sampler that kills the process when step N draws its batch, so an
    interrupted-and-resumed run can be compared with an uninterrupted one deterministically."""

    def __init__(self, sampler, step: int):
        self._sampler, self._step, self._calls = sampler, step, 0

    def sample(self, batch_size: int):
        self._calls += 1
        if self._calls == self._step:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        return self._sampler.sample(batch_size)

    def __getattr__(self, name):
        return getattr(self._sampler, name)
