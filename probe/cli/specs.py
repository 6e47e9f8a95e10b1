"""The parsed flags as typed specs: the one place that reads the shared flags off an ``argparse.Namespace``.

Lists are deduplicated here, in the order given (``--dose 0.4 0.4`` is one condition, ``--eps 0.3 0.3`` one threshold).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from probe.jobs.specs import InjectionSpec, ModelSpec, WindowSpec
from probe.present.files import OutputSpec


def _unique(values) -> tuple:
    return tuple(dict.fromkeys(values))


def model_spec(args: argparse.Namespace, default: str | None = None) -> ModelSpec:
    """--model (``default`` when absent), --device, --dtype, --threads, --device-map, --max-memory, --offload-dir."""
    return ModelSpec(name=args.model, default=default, device=args.device, dtype=args.dtype,
                     threads=args.threads, device_map=args.device_map, max_memory=args.max_memory,
                     offload_dir=args.offload_dir)


def window_spec(args: argparse.Namespace) -> WindowSpec:
    """--data, --tokenizer, --batches, --batch-size, --ctx, --window-mode, --seed, --bos / --no-bos."""
    return WindowSpec(data=args.data, tokenizer=args.tokenizer, batches=args.batches, batch_size=args.batch_size,
                      ctx=args.ctx, mode=args.window_mode, seed=args.seed, bos=args.bos)


def injection_spec(args: argparse.Namespace) -> InjectionSpec | None:
    """--junk, --cutoff and the doses (--dose, or report's --inject-doses); None when no dose was asked for."""
    if not args.dose:
        return None
    return InjectionSpec(doses=_unique(args.dose), junk=_unique(args.junk), cutoffs=_unique(args.cutoff))


def _is_main() -> bool:
    """Rank 0 of the process group, or the only process. A group exists only once torch.distributed is imported
    (probe.cli.distributed does so before the verb runs), so a verb that never imports torch, like ``probe models``,
    is the main process without importing it (torch costs seconds)."""
    if "torch.distributed" not in sys.modules:
        return True
    from probe.analyses.parallel import is_main

    return is_main()


def output_spec(args: argparse.Namespace) -> OutputSpec:
    """--out, --json, --quiet, --self-contained; under torchrun only rank 0 writes and prints (the others are quiet)."""
    if not _is_main():
        return OutputSpec(out=None, as_json=False, quiet=True, writer=False)
    return OutputSpec(out=Path(args.out) if args.out else None, as_json=args.json, quiet=args.quiet,
                      self_contained=getattr(args, "self_contained", False))


def eps_values(args: argparse.Namespace) -> tuple[float, ...]:
    """--eps: the Sink^eps thresholds."""
    return _unique(args.eps)
