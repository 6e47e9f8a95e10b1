"""Data-parallel analyses: 2 (and 3) gloo ranks on CPU give one process's tables to floating-point tolerance, however
the batches split (3 batches over 2 ranks; 2 batches over 3 ranks, so one rank gets none)."""
from __future__ import annotations

import os
import socket

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from probe.analyses.parallel import batches_of_rank, gather_rows, rank_and_world


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FORWARDS = [0]  # forward passes of the analysed model in this process


def _model(variant: str):
    from probe.models import create

    model = create(variant, tier="tiny", seed=0, n_layers=2).eval()
    model.register_forward_pre_hook(lambda *_: FORWARDS.__setitem__(0, FORWARDS[0] + 1))
    return model


def _windows(n_batches: int):
    from probe.data import eval_batches

    return eval_batches("wikitext-2-test", "probe-bpe-8k", n_batches=n_batches, batch_size=2, ctx=32,
                        mode="sequential")


def _run(analysis: str, n_batches: int) -> dict[str, pd.DataFrame]:
    """One analysis on the fixed tiny setting; the same call in every rank and in the reference process."""
    from probe.analyses import dormant, gates, inject, massive, sink_heads, sinks, sources
    from probe.analyses.capture import window_losses

    torch.set_num_threads(1)
    data = _windows(n_batches)
    if analysis == "sinks":
        return sinks.sink_stats(_model("sink+proj"), data)
    if analysis == "sinks_reference":
        return sinks.sink_stats_reference(_model("sinklogit"), data)
    if analysis == "inject":
        return inject.inject(_model("sink+proj"), data, junk=("structured", "gaussian"), doses=(0.4, 1.6),
                             progress=False)
    if analysis == "gates":
        return gates.gate_stats(_model("projgate"), data, min_count=2)
    if analysis == "sources":
        return sources.effective_sources(_model("attnres-block4"), data)
    if analysis == "sink_heads":
        return sink_heads.sink_heads(_model("baseline"), data)
    if analysis == "massive":
        return massive.massive_activations(_model("baseline"), data)
    if analysis == "dormant":
        return dormant.dormant_heads(_model("sinklogit"), {"a": data, "b": _windows(n_batches)})
    if analysis == "window_losses":
        return {"windows": window_losses(_model("baseline"), data)}
    raise ValueError(analysis)


def _rank_main(rank: int, world: int, port: int, analysis: str, n_batches: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        tables = _run(analysis, n_batches)
        with open(os.path.join(out, f"forwards{rank}.txt"), "w") as f:
            f.write(str(FORWARDS[0]))
        if rank == 0:
            for name, df in tables.items():
                df.to_csv(os.path.join(out, f"{name}.csv"), index=False)
    finally:
        dist.destroy_process_group()


def _spawned(analysis: str, n_batches: int, world: int, tmp_path) -> dict[str, pd.DataFrame]:
    tmp_path.mkdir()
    mp.spawn(_rank_main, args=(world, _free_port(), analysis, n_batches, str(tmp_path)), nprocs=world, join=True)
    return {p.stem: pd.read_csv(p) for p in tmp_path.glob("*.csv")}


def _forwards(tmp_path, world: int) -> list[int]:
    return [int((tmp_path / f"forwards{r}.txt").read_text()) for r in range(world)]


def _round_trip(tables: dict[str, pd.DataFrame], tmp_path) -> dict[str, pd.DataFrame]:
    """The one-process tables written and read back like the ranks' (same CSV dtypes)."""
    tmp_path.mkdir()
    for name, df in tables.items():
        df.to_csv(tmp_path / f"{name}.csv", index=False)
    return {p.stem: pd.read_csv(p) for p in tmp_path.glob("*.csv")}


@pytest.mark.parametrize("analysis,n_batches,world", [
    ("sinks", 3, 2), ("sinks", 2, 3), ("sinks_reference", 3, 2), ("inject", 3, 2), ("inject", 2, 3),
    ("gates", 3, 2), ("sources", 3, 2), ("sink_heads", 3, 2), ("massive", 3, 2), ("dormant", 3, 2),
    ("window_losses", 3, 2)])
def test_ranks_match_one_process(analysis, n_batches, world, tmp_path):
    parallel = _spawned(analysis, n_batches, world, tmp_path / "ranks")
    FORWARDS[0] = 0
    single = _round_trip(_run(analysis, n_batches), tmp_path / "one")
    per_batch = FORWARDS[0] // n_batches
    # each rank ran only its own batches (round-robin by global index); with more ranks than batches one ran none
    assert _forwards(tmp_path / "ranks", world) == [len(range(r, n_batches, world)) * per_batch for r in range(world)]
    assert sorted(parallel) == sorted(single)
    for name in single:
        pd.testing.assert_frame_equal(parallel[name], single[name], check_exact=False, rtol=1e-9, atol=1e-12,
                                      obj=f"{analysis}:{name}")


def test_one_process_takes_every_batch():
    assert rank_and_world() == (0, 1)
    assert list(batches_of_rank(5)) == [0, 1, 2, 3, 4]
    rows = [{"batch": 1}, {"batch": 0}]
    assert gather_rows(rows) == rows  # one process: rows stay as they were made
