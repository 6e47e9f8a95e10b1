"""The training loop: paired seeds, grad accumulation, DDP, JSONL metrics, exact resume.

One optimizer step consumes one *global* batch of ``cfg.batch_size`` windows, drawn in one ``sampler.sample`` call and
split into ``world_size × grad_accum`` equal micro-batches, so the data (and, up to float summation order, the update)
does not depend on how the batch is split — the abstention paper's "micro-batch 16 × 4 ≡ batch 64" check.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Protocol

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from probe.data.limits import check_windows_fit
from probe.kernels.denormals import set_flush_denormal
from probe.kernels.heap import keep_freed_memory
from probe.progress import progress_bar
from probe.runs import CHECKPOINT, METRICS, SNAPSHOTS, TRAIN_CONFIG, metrics_records, snapshot_dir, snapshot_steps
from probe.writes import TEMP_PREFIX, append_line, atomic_write

from . import distributed as D
from .checkpoint import (
    export_model,
    find_checkpoint,
    load_checkpoint,
    load_model,
    read_state,
    save_checkpoint,
    seed_rngs,
)
from .config import TrainConfig
from .optim import build_optimizer
from .schedule import lr_factor


class Sampler(Protocol):
    """What the loop needs from a data sampler (``probe.data.WindowSampler`` is one)."""

    def sample(self, batch_size: int) -> torch.LongTensor: ...  # (B, ctx + 1) token windows
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, z_loss: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean next-token cross-entropy, the objective = CE + z_loss · mean(logsumexp²)), both in fp32."""
    logits = logits.float()
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    if not z_loss:
        return ce, ce
    return ce, ce + z_loss * torch.logsumexp(logits, dim=-1).pow(2).mean()


def _logits(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out[0] if isinstance(out, tuple) else out


def _autocast(device: torch.device, amp: str):
    if amp == "bf16" or (amp == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if amp not in ("auto", "fp32"):
        raise ValueError(f"unknown amp {amp!r}: use 'auto', 'bf16' or 'fp32'")
    return nullcontext()


@torch.no_grad()
def evaluate(model: nn.Module, eval_batches, *, max_batches: int | None = None, amp: str = "auto") -> float:
    """Mean next-token loss over every position of fixed batches.

    ``eval_batches``: an object with ``.tokens`` (N, B, ctx + 1) such as ``probe.data.EvalBatches``, such a tensor,
    or an iterable of (B, ctx + 1) windows. The model sees window[:, :-1] and is scored on window[:, 1:].
    """
    batches = getattr(eval_batches, "tokens", eval_batches)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i, window in enumerate(batches):
        if max_batches and i >= max_batches:
            break
        window = window.to(device)
        with _autocast(device, amp):
            logits = _logits(model(window[:, :-1]))
        total += F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten(), reduction="sum").item()
        count += window[:, 1:].numel()
    model.train(was_training)
    if count == 0:
        raise ValueError("no evaluation batches")
    return total / count


def read_metrics(run_dir: str | os.PathLike) -> pd.DataFrame:
    """A run's ``metrics.jsonl`` as a DataFrame (one row per logged step: step, loss, lr, grad_norm, tokens,
    tokens_per_s, and val_loss where an evaluation ran); empty when nothing was logged yet."""
    return pd.DataFrame(metrics_records(Path(run_dir)))


def _write_metrics(path: Path, records: list[dict]):
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in records))


def capped_warmup(warmup: int, steps: int) -> int:
    """``warmup``, or a tenth of the run when it is not shorter than the run (the lr would never reach its peak)."""
    return warmup if warmup < steps else steps // 10


def log_interval(log_every: int, steps: int) -> int:
    """Steps between metrics records: often enough that a short run still draws a curve (about 50 points)."""
    return min(log_every, max(1, steps // 50))


def _runtime(cfg: TrainConfig, info: D.DistInfo) -> torch.device:
    """The run's device; where asked, denormal floats flushed to zero, process-wide: this thread and torch's intra-op
    threads (TrainConfig.flush_denormal; probe.kernels.denormals). On CPU, freed memory stays in the process for the
    next step (probe.kernels.heap; PROBE_KEEP_FREED_MEMORY=0 leaves malloc as it is)."""
    if cfg.flush_denormal:
        set_flush_denormal(True)
    if cfg.device == "auto":
        device = torch.device(f"cuda:{info.local_rank}" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(cfg.device)
    if device.type == "cpu":
        keep_freed_memory()
    return device


def train(
    model: nn.Module,
    sampler: Sampler,
    cfg: TrainConfig,
    out_dir,
    *,
    eval_batches=None,
    resume: bool = True,
    progress: bool = True,
    tokenizer=None,
) -> dict:
    """Train ``model`` in place for ``cfg.steps`` optimizer steps; returns the last metrics record.

    Writes ``out_dir/metrics.jsonl`` and ``out_dir/checkpoint/`` (rank 0 only; the layout is ``probe.runs``). With
    ``resume`` it continues from the checkpoint there — bit-exactly on CPU — and a finished run only loads its final
    weights into ``model`` and returns its recorded final metrics. ``resume=False`` discards what ``out_dir`` holds.
    With ``cfg.snapshot_every`` the model (and ``tokenizer``, when given) is also exported to
    ``out_dir/snapshots/step{N}`` — a training trajectory that ``probe report --checkpoints out_dir`` reads.
    """
    out_dir = Path(out_dir)
    info = D.setup(cfg.device)
    device = _runtime(cfg, info)
    warmup, log_every = _schedule(cfg, sampler, info)
    if getattr(sampler, "ctx", None):
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        check_batch_fits(cfg.batch_size, sampler.ctx, vocab, info.world_size * cfg.grad_accum)
    model.to(device)
    optimizer = build_optimizer(model, cfg)
    step, last, finished = _begin(model, optimizer, sampler, cfg, out_dir, info, resume, eval_batches, tokenizer)
    if finished:
        return last
    D.barrier()

    net = model
    if info.enabled:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    model.train()
    bar = progress_bar(cfg.steps, "train", unit="step", enabled=progress and info.is_main, initial=step)
    t_log, step_log = time.perf_counter(), step
    while step < cfg.steps:
        factor = lr_factor(step, cfg.steps, warmup, cfg.schedule, cfg.min_lr_ratio, cfg.warmdown)
        loss, grad_norm, tokens_per_step = _optimizer_step(net, model, optimizer, sampler, cfg, info, device, factor)
        step += 1
        bar.update(1)

        final = step == cfg.steps
        eval_step = final or bool(cfg.eval_every and step % cfg.eval_every == 0)
        if final or step % log_every == 0 or eval_step:  # the same steps on every rank (a collective follows)
            loss_v = D.mean_over_ranks(loss).item()
            if not math.isfinite(loss_v):
                raise FloatingPointError(f"loss is {loss_v} at step {step}")
            now = time.perf_counter()  # throughput since the previous record (includes evals and checkpoints)
            last = {
                "step": step,
                "loss": loss_v,
                "lr": cfg.lr * factor,
                "grad_norm": grad_norm.item(),
                "tokens": step * tokens_per_step,
                "tokens_per_s": (step - step_log) * tokens_per_step / (now - t_log),
            }
            t_log, step_log = now, step
            if eval_step and eval_batches is not None and info.is_main:
                last["val_loss"] = evaluate(
                    model, eval_batches, max_batches=None if final else cfg.eval_batches, amp=cfg.amp
                )
            if info.is_main:
                append_line(out_dir / METRICS, json.dumps(last) + "\n")
            bar.set_postfix(loss=f"{loss_v:.4f}", **({"val": f"{last['val_loss']:.4f}"} if "val_loss" in last else {}))
        # the snapshot before the checkpoint: a checkpoint at this step means its snapshot is there, so a run killed
        # between the two resumes from the previous checkpoint and writes both again (never a finished run without
        # its last snapshot)
        if _snapshot_due(cfg, step, final) and info.is_main:
            export_model(model, snapshot_dir(out_dir, step), tokenizer, root=out_dir)
        if final or (cfg.ckpt_every and step % cfg.ckpt_every == 0):
            if info.is_main:
                save_checkpoint(out_dir, model, optimizer, sampler, step, {"config": _jsonable(cfg), "metrics": last})
            D.barrier()
    bar.close()
    return last


def _begin(
    model, optimizer, sampler: Sampler, cfg: TrainConfig, out_dir: Path, info, resume: bool, eval_batches, tokenizer
) -> tuple[int, dict | None, bool]:
    """(the step to continue from, its metrics record, whether the run is finished): the run resumed from its
    checkpoint (a finished one only loads its final weights), else started afresh."""
    ckpt = find_checkpoint(out_dir) if resume else None
    if resume and info.is_main:
        _remove_leftovers(out_dir, ckpt)
    if ckpt is None:
        seed_rngs(cfg.seed)
        if info.is_main:
            _start_run(model, cfg, out_dir, eval_batches, tokenizer)
        return 0, None, False
    meta = read_state(ckpt)
    if meta.get("config") != _jsonable(cfg):
        warnings.warn(f"resuming {ckpt} with a different TrainConfig than it was written with", stacklevel=3)
    if meta["step"] >= cfg.steps:  # finished: nothing to train
        load_model(model, ckpt)
        if info.is_main:
            _restore_snapshot(model, cfg, out_dir, meta["step"], tokenizer, final=True)
        return meta["step"], meta.get("metrics") or {"step": meta["step"]}, True
    meta = load_checkpoint(ckpt, model, optimizer, sampler)
    step = meta["step"]
    if info.is_main:  # the records past the checkpoint are logged again as the steps are
        _write_metrics(out_dir / METRICS, [r for r in metrics_records(out_dir) if r["step"] <= step])
        _restore_snapshot(model, cfg, out_dir, step, tokenizer, final=False)
    return step, meta.get("metrics"), False


def _snapshot_due(cfg: TrainConfig, step: int, final: bool) -> bool:
    return bool(cfg.snapshot_every) and (final or step % cfg.snapshot_every == 0)


def _restore_snapshot(model: nn.Module, cfg: TrainConfig, out_dir: Path, step: int, tokenizer, *, final: bool) -> None:
    """The snapshot due at the checkpoint's ``step``, exported from the weights just loaded when it is missing: a run
    written before snapshots came first, killed between its checkpoint and its snapshot, would otherwise never get it
    (a finished run trains no step, and the next snapshot is a later step)."""
    if _snapshot_due(cfg, step, final) and step not in snapshot_steps(out_dir):
        export_model(model, snapshot_dir(out_dir, step), tokenizer, root=out_dir)


def _remove_leftovers(out_dir: Path, ckpt: Path | None) -> None:
    """What a killed run of this folder staged and never renamed (a checkpoint, a snapshot, the metrics), and the
    previous checkpoint when the current one is whole (a kill between the swap and its removal): the run folder then
    holds what an uninterrupted run leaves. Only the trainer's own names; the caller's lock, if any, cleans the rest."""
    if not out_dir.is_dir():
        return
    own = tuple(f"{TEMP_PREFIX}{name}." for name in (CHECKPOINT, METRICS, TRAIN_CONFIG))
    for path in [p for p in out_dir.iterdir() if p.name.startswith(own)] + _snapshot_leftovers(out_dir):
        _remove(path)
    if ckpt is not None and ckpt.name == CHECKPOINT:
        shutil.rmtree(out_dir / f"{CHECKPOINT}.old", ignore_errors=True)


def _snapshot_leftovers(out_dir: Path) -> list[Path]:
    folder = out_dir / SNAPSHOTS
    if not folder.is_dir() or folder.is_symlink():
        return []
    return [p for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX)]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _schedule(cfg: TrainConfig, sampler: Sampler, info: D.DistInfo) -> tuple[int, int]:
    """(warmup steps, steps between metrics records) of ``cfg``, after checking that its batch splits evenly; warns
    (at ``train``'s caller) on a sampler seeded apart from the run and on a warmup as long as the run."""
    if cfg.batch_size % (info.world_size * cfg.grad_accum):
        raise ValueError(
            f"batch_size {cfg.batch_size} must divide into world_size {info.world_size} × "
            f"grad_accum {cfg.grad_accum} equal micro-batches"
        )
    if getattr(sampler, "seed", cfg.seed) != cfg.seed:
        warnings.warn(
            f"sampler seed {sampler.seed} != cfg.seed {cfg.seed}: paired runs need the same seed for both", stacklevel=3
        )
    if cfg.warmup >= cfg.steps:
        warnings.warn(
            f"warmup {cfg.warmup} >= steps {cfg.steps}: the lr would never reach its peak; warming up for "
            f"{capped_warmup(cfg.warmup, cfg.steps)} steps instead",
            stacklevel=3,
        )
    return capped_warmup(cfg.warmup, cfg.steps), log_interval(cfg.log_every, cfg.steps)


def check_batch_fits(batch_size: int, ctx: int, vocab_size: int | None, micro_batches: int) -> None:
    """A step's token windows, and one micro-batch's fp32 logits (a lower bound of what its forward holds), must fit
    half the memory available: an absurd batch is one ValueError line before the run, not an allocator failure in
    its first step."""
    fix = "choose a smaller --batch-size or --ctx"
    check_windows_fit(batch_size * (ctx + 1) * 8, f"--batch-size {batch_size} windows of {ctx + 1} tokens", fix)
    if vocab_size:
        micro = batch_size // micro_batches
        what = f"the logits of a micro-batch of {micro} x {ctx} tokens over {vocab_size} ids (fp32)"
        check_windows_fit(micro * ctx * vocab_size * 4, what, f"{fix}, or a larger --grad-accum")


def _start_run(model: nn.Module, cfg: TrainConfig, out_dir: Path, eval_batches, tokenizer) -> None:
    """A fresh run directory (rank 0): what an earlier run left is removed; the metrics start with the initial
    model's validation loss at step 0 (the validation curve starts where training did), then the TrainConfig and
    the step-0 snapshot."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (CHECKPOINT, f"{CHECKPOINT}.old", f"{CHECKPOINT}.tmp", SNAPSHOTS):
        shutil.rmtree(out_dir / name, ignore_errors=True)
    first = []
    if eval_batches is not None:
        val_loss = evaluate(model, eval_batches, max_batches=cfg.eval_batches, amp=cfg.amp)
        first.append({"step": 0, "tokens": 0, "val_loss": val_loss})
    _write_metrics(out_dir / METRICS, first)
    atomic_write(out_dir / TRAIN_CONFIG, json.dumps(_jsonable(cfg), indent=1))
    if cfg.snapshot_every:
        export_model(model, snapshot_dir(out_dir, 0), tokenizer, root=out_dir)


def _optimizer_step(net, model, optimizer, sampler: Sampler, cfg: TrainConfig, info, device, factor: float):
    """One optimizer step at lr factor ``factor`` over one global batch in ``grad_accum`` micro-batches per rank
    (gradients synchronised on the last); returns (this rank's mean CE, the gradient norm before clipping, tokens
    per step)."""
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor
    window = sampler.sample(cfg.batch_size)
    micro = D.shard(window, info).to(device).chunk(cfg.grad_accum)
    loss = torch.zeros((), device=device)
    for i, mb in enumerate(micro):
        sync = not info.enabled or i == len(micro) - 1
        with nullcontext() if sync else net.no_sync():
            with _autocast(device, cfg.amp):
                logits = _logits(net(mb[:, :-1]))
            ce, objective = lm_loss(logits, mb[:, 1:], cfg.z_loss)
            (objective / cfg.grad_accum).backward()
        loss += ce.detach() / cfg.grad_accum
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, grad_norm, cfg.batch_size * (window.shape[1] - 1)


def _jsonable(cfg: TrainConfig) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))
