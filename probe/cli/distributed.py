"""``probe VERB`` under ``torchrun``: one process group for the analysis verbs, and errors that end every rank at once.

``torchrun --nproc_per_node N -m probe.cli sinks ...`` starts N copies of the command. With WORLD_SIZE > 1 the verbs
in ``PARALLEL_VERBS`` join the process group torchrun describes (gloo on the CPU, NCCL on CUDA, rank r on GPU
LOCAL_RANK), each rank evaluates its own whole batches and the accumulators merge (``probe.analyses.parallel``); rank 0
alone writes files and prints, the others are quiet.

Errors. A user error before the group exists (a bad flag, a bad --out) is met by every rank alike: all exit 2 and rank 0
prints the line. Setup that may fail on one rank only (loading the model, cutting the windows) runs inside
:func:`all_ranks_agree`, which every rank leaves together: if any rank failed, all raise that failure (exit 2, rank 0
prints it) instead of the others waiting in the first merge for a rank that is gone. Anything later that kills one rank
is torchrun's to handle (it stops the others at once); under another launcher the group's timeout ends the wait
(PROBE_DIST_TIMEOUT seconds, default 1800: long enough for one rank's share of an analysis pass on a big model).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from probe.analyses.parallel import gather
from probe.errors import UsageError, first_line
from probe.jobs.lock import acquire as acquire_lock
from probe.present.files import check_out_dir
from probe.process_group import from_env, join_group, rank_and_world

PARALLEL_VERBS = ("sinks", "inject", "ablate", "gates", "sources", "eval")


def group_timeout() -> timedelta:
    return timedelta(seconds=float(os.environ.get("PROBE_DIST_TIMEOUT", "1800")))


def run_on_ranks(run, args) -> int:
    """Run one verb on this rank inside the process group; a UsageError of this rank alone is marked as such (with
    its rank), so that a rank other than 0 prints it too."""
    info = from_env()
    if args.verb not in PARALLEL_VERBS:
        raise UsageError(
            f"`probe {args.verb}` does not run under torchrun (WORLD_SIZE={info.world_size}); the "
            f"verbs that do are {', '.join(PARALLEL_VERBS)}"
        )
    if args.device_map not in (None, "cpu"):
        raise UsageError(
            f"--device-map {args.device_map!r} under torchrun would spread every rank's copy over the "
            "same devices; run one process with --device-map, or one rank per GPU without it"
        )
    cuda = torch.cuda.is_available() and not args.device.startswith("cpu") and args.device_map is None
    owned = join_group(info, cuda, group_timeout())  # a Python caller may already be in a group: use it, leave it
    lock = None
    try:
        with all_ranks_agree():  # a bad or busy --out ends every rank (rank 0 alone writes, so it alone checks)
            if info.rank == 0 and getattr(args, "out", None):
                check_out_dir(args.out, prog=f"probe {args.verb}")
                lock = acquire_lock(args.out, wait=getattr(args, "wait", False), prog=f"probe {args.verb}")
        return run(args)
    except UsageError as e:
        if not getattr(e, "shared", False):
            e.rank_local = True
            if info.rank:
                e.args = (f"rank {info.rank}: {e}",)
        raise
    finally:
        if lock is not None:
            lock.release()
        if owned:
            dist.destroy_process_group()


@contextmanager
def all_ranks_agree():
    """Setup that every rank leaves together: a failure on any rank becomes a UsageError on all of them (the lowest
    failing rank's, as one line), so no rank goes on to a collective that a failed rank will never join.

    The failing rank re-raises its own exception when it is not a UsageError (its traceback is the evidence)."""
    rank, world = rank_and_world()
    if world == 1:
        yield
        return
    failure = None
    try:
        yield
    except Exception as e:  # noqa: BLE001 - every failure must reach the other ranks before anything is raised
        failure = e
    reports = gather(
        None
        if failure is None
        else (
            getattr(failure, "prog", None),
            failure.one_line() if isinstance(failure, UsageError) else first_line(failure),
        )
    )
    first = next(((r, report) for r, report in enumerate(reports) if report is not None), None)
    if first is None:
        return
    if failure is not None and not isinstance(failure, UsageError):
        raise failure
    r, (prog, line) = first
    error = UsageError(line if r == 0 else f"rank {r}: {line}", prog or "probe")
    error.shared = True
    raise error


__all__ = ["PARALLEL_VERBS", "run_on_ranks", "all_ranks_agree", "group_timeout"]
