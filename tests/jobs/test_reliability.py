"""Hostile inputs to the job layer, one kind per section: writes that a planted link or a full disk must not corrupt,
run folders that two processes must not share, model names and sizes that must not lead out of the zoo or into an
allocation that cannot fit, and corpus files that must not hang, crash or be silently thinned."""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import probe.present.files as files
import probe.writes as writes
from probe.cli.main import build_parser, main
from probe.errors import UsageError
from probe.jobs.lock import LOCK_NAME, acquire, this_host

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
ZOO_MODEL = REPO / "probe" / "zoo" / "tiny-sink+proj"


def probe_cli(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "probe.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
        cwd=REPO,
    )


def one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------------------------------------------------------
# safe writes


def test_a_link_planted_at_the_old_temp_name_is_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("a.csv", "b.json"):  # the temp names the writer used to stage under, predictable from the PID
        os.symlink(victim, out / f".{name}.tmp-{os.getpid()}")
    os.symlink(victim, out / "a.csv")  # and a link at the final name itself
    writes.write_files(out, {"a.csv": "x,y\n1,2\n", "b.json": "{}"})
    assert victim.read_text() == "precious"
    assert not (out / "a.csv").is_symlink() and (out / "a.csv").read_text() == "x,y\n1,2\n"
    assert (out / "b.json").read_text() == "{}"
    assert not [p for p in out.iterdir() if p.name.startswith(writes.TEMP_PREFIX)]


def test_the_out_check_truncates_nothing(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / f".probe-write-check-{os.getpid()}")  # the name the check used to open and empty
    assert files.check_out_dir(out) == out
    assert victim.read_text() == "precious"


def test_files_are_synced_before_their_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(f"replace {Path(b).name}"), real_replace(a, b))[1])
    writes.atomic_write(tmp_path / "manifest.json", "{}")
    assert events.index("fsync") < events.index("replace manifest.json")
    assert events[-1] == "fsync"  # the folder, so the new name survives a crash too


def test_written_files_are_readable_like_any_other(tmp_path):
    writes.atomic_write(tmp_path / "t.csv", "a\n")
    assert (tmp_path / "t.csv").stat().st_mode & 0o777 == writes.FILE_MODE  # not mkstemp's private 0600


def _full_disk(monkeypatch):
    def no_space(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writes, "_write_all", no_space)


def test_a_full_disk_is_exit_1_one_line_and_leaves_no_folder(tmp_path, monkeypatch, capsys):
    _full_disk(monkeypatch)
    out = tmp_path / "new" / "run"
    rc = main(["costs", "--out", str(out)])
    err = one_line(capsys.readouterr().err)
    assert rc == 1
    assert "No space left on device" in err and str(out) in err and "cannot write" in err
    assert not (tmp_path / "new").exists()  # no empty --out, no half-written file, no temp file


def test_a_full_disk_keeps_the_previous_files_whole(tmp_path, monkeypatch):
    writes.write_files(tmp_path, {"a.csv": "old\n"})
    _full_disk(monkeypatch)
    with pytest.raises(writes.WriteError, match="No space left on device"):
        writes.write_files(tmp_path, {"a.csv": "new\n", "b.csv": "new\n"})
    assert (tmp_path / "a.csv").read_text() == "old\n" and not (tmp_path / "b.csv").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv"]


def test_a_killed_runs_temp_files_are_removed_by_the_next_run(tmp_path):
    out = tmp_path / "out"
    (out / "models").mkdir(parents=True)
    stale = [out / f"{writes.TEMP_PREFIX}costs.json.k2j3h4", out / "models" / f"{writes.TEMP_PREFIX}m.json.x9"]
    for p in stale:
        p.write_text("half")
    (out / f"{writes.TEMP_PREFIX}checkpoint.abc").mkdir()  # a staged checkpoint folder
    (out / ".mine").write_text("a user's hidden file")
    r = probe_cli("costs", "--out", out)
    assert r.returncode == 0, r.stderr
    assert not any(p.exists() for p in stale) and not (out / f"{writes.TEMP_PREFIX}checkpoint.abc").exists()
    assert (out / ".mine").read_text() == "a user's hidden file"
    assert (out / "costs.json").is_file() and not (out / LOCK_NAME).exists()


# ---------------------------------------------------------------------------------------------------------------
# run-folder locks

HOLDER = """
import sys
from probe.jobs.lock import acquire
lock = acquire(sys.argv[1])
print("held", flush=True)
sys.stdin.readline()
lock.release()
"""


def _holder(folder: Path) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=REPO,
    )
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_process_on_a_held_folder_exits_2_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    holder = _holder(out)
    try:
        r = probe_cli("costs", "--out", out)
        line = one_line(r.stderr)
        assert r.returncode == 2
        assert f"pid {holder.pid} on host {this_host()}" in line and "--wait" in line
        assert not (out / "costs.json").exists()
    finally:
        holder.communicate("\n", timeout=30)


def test_wait_queues_behind_the_holder(tmp_path):
    out = tmp_path / "out"
    holder = _holder(out)
    waiter = subprocess.Popen(
        [sys.executable, "-m", "probe.cli", "costs", "--out", str(out), "--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=REPO,
    )
    try:
        first = waiter.stderr.readline()  # written just before it blocks on the lock
        assert f"waiting for pid {holder.pid}" in first, first
        time.sleep(2)
        assert waiter.poll() is None and not (out / "costs.json").exists()  # still queued
    finally:
        holder.communicate("\n", timeout=30)
    _, err = waiter.communicate(timeout=300)
    assert waiter.returncode == 0, err
    assert (out / "costs.json").is_file()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_lock_left_by_a_dead_process_on_this_host_is_taken_over(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": _dead_pid(), "host": this_host(), "command": "probe train"}))
    r = probe_cli("costs", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "taking over the lock" in r.stderr and (out / "costs.json").is_file()
    assert not (out / LOCK_NAME).exists()  # released at the end


def test_a_lock_of_another_host_is_reported_not_taken(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": 4242, "host": "other-node-7", "command": "probe report"}))
    with pytest.raises(UsageError, match="pid 4242 on host other-node-7.*another host.*remove"):
        acquire(out)
    assert json.loads((out / LOCK_NAME).read_text())["host"] == "other-node-7"


def test_a_lock_file_that_is_a_link_or_a_fifo_is_refused(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / LOCK_NAME)
    with pytest.raises(UsageError, match="lock file"):
        acquire(out)
    assert victim.read_text() == "precious"
    os.unlink(out / LOCK_NAME)
    os.mkfifo(out / LOCK_NAME)
    with pytest.raises(UsageError, match="lock file .* is not a regular file"):
        acquire(out)


def test_every_verb_that_writes_out_can_wait_and_every_reader_of_data_can_skip():
    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for verb, p in sub.choices.items():
        flags = {o for a in p._actions for o in a.option_strings}
        assert ("--out" in flags) == ("--wait" in flags), verb
        assert ("--data" in flags) == ("--skip-bad-records" in flags), verb
    assert "--skip-bad-records" in {o for a in sub.choices["sinks"]._actions for o in a.option_strings}


# ---------------------------------------------------------------------------------------------------------------
# names and sizes


def test_a_zoo_name_cannot_lead_out_of_the_zoo(tmp_path, monkeypatch):
    from probe.checkpoints.load import ZOO_DIR, ModelNotFoundError, resolve

    elsewhere = tmp_path / "elsewhere" / "tiny-sink+proj"
    shutil.copytree(ZOO_MODEL, elsewhere)
    monkeypatch.chdir(tmp_path)  # no probe/ folder here, so the name is no relative path either
    for name in (f"probe/{os.path.relpath(elsewhere, ZOO_DIR)}", f"probe/{elsewhere}", "tiny-../elsewhere"):
        with pytest.raises(ModelNotFoundError, match="no zoo checkpoint .*available: .*tiny-sink\\+proj"):
            resolve(name)
    assert resolve("probe/tiny-sink+proj") == (str(ZOO_MODEL), None, "zoo")


def _copy_model(tmp_path, **config) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(ZOO_MODEL, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **config}))
    return folder


def test_a_config_whose_sizes_the_weights_do_not_hold_is_one_line_before_any_allocation(tmp_path):
    import probe
    from probe.checkpoints.sizes import CheckpointSizeError

    folder = _copy_model(tmp_path, d_mlp=10**6)  # 2.3e9 parameters: gigabytes if it were allocated
    with pytest.raises(
        CheckpointSizeError,
        match=r"config implies 2,305,444,272 parameters, its safetensors "
        r"headers hold 2,329,008 \(fewer by",
    ):
        probe.load(folder)


def test_one_layer_more_than_the_weights_is_refused(tmp_path):
    from probe.checkpoints.sizes import CheckpointSizeError, check_sizes

    with pytest.raises(CheckpointSizeError, match="fewer by 213,384"):
        check_sizes(_copy_model(tmp_path, n_layers=7), "m")


def test_packed_weights_of_a_quantized_checkpoint_are_not_counted_as_missing(tmp_path):
    from probe.checkpoints.sizes import check_sizes, implied_counts

    folder = _copy_model(tmp_path, n_layers=7, quantization_config={"quant_method": "mxfp4"})
    assert implied_counts(folder) is None  # 4-bit blocks hold fewer elements than the parameters they pack
    check_sizes(folder, "m")


def test_weights_that_do_not_fit_the_memory_are_refused(tmp_path, monkeypatch):
    import probe.checkpoints.sizes as sizes

    monkeypatch.setattr(sizes, "available_memory", lambda: 1 << 20)
    with pytest.raises(
        sizes.CheckpointSizeError,
        match=r"weights need 8\.9 MB, more than the 1\.0 MB of memory "
        r"available \(by 7\.9 MB\)",
    ):
        sizes.check_sizes(ZOO_MODEL, "m", dtype_bytes=4)


def test_a_truncated_weight_file_is_named(tmp_path):
    from probe.checkpoints.sizes import CheckpointSizeError, check_sizes

    folder = _copy_model(tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(CheckpointSizeError, match="model.safetensors is truncated"):
        check_sizes(folder, "m")


def test_random_windows_are_counted_before_allocation(monkeypatch):
    import probe.data.batches as batches
    import probe.data.limits as limits

    monkeypatch.setattr(limits, "available_memory", lambda: 1 << 20)
    calls = []
    monkeypatch.setattr(batches, "tokenize_documents", lambda *a, **k: calls.append(a) or [])
    for mode in ("random", "sequential", "first"):
        with pytest.raises(
            ValueError,
            match=r"n_batches\*batch_size=8000 windows of 257 tokens need 15\.7 MB, more "
            r"than half the 1\.0 MB of memory available",
        ):
            batches.eval_batches(["some text"], "probe-bpe-8k", n_batches=1000, batch_size=8, ctx=256, mode=mode)
    assert not calls  # refused before the corpus was even tokenized


# ---------------------------------------------------------------------------------------------------------------
# files that are read


def test_a_fifo_or_device_in_a_data_folder_is_named_not_read(tmp_path):
    from probe.data.corpus import load_corpus

    (tmp_path / "a.txt").write_text("some text")
    os.mkfifo(tmp_path / "b.txt")  # opened for reading, it would wait forever for a writer
    with pytest.raises(ValueError, match=r"b\.txt is a FIFO, not a regular file"):
        load_corpus(tmp_path)
    os.unlink(tmp_path / "b.txt")
    os.symlink("/dev/zero", tmp_path / "z.txt")  # endless
    with pytest.raises(ValueError, match=r"z\.txt is a device \(through a link\), not a regular file"):
        load_corpus(tmp_path)
    os.mkfifo(tmp_path / "notes.txt.fifo")
    with pytest.raises(ValueError, match="is a FIFO"):
        load_corpus(tmp_path / "notes.txt.fifo")


def test_truncated_compression_is_one_line_naming_the_file(tmp_path):
    from probe.data.corpus import load_corpus

    whole = gzip.compress(b"".join(json.dumps({"text": f"document {i} " * 50}).encode() + b"\n" for i in range(200)))
    bad = tmp_path / "shard.jsonl.gz"
    bad.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"shard\.jsonl\.gz is corrupt or truncated compressed data"):
        load_corpus(bad)
    bad.write_bytes(b"\x1f\x8b" + os.urandom(200))
    with pytest.raises(ValueError, match=r"shard\.jsonl\.gz is corrupt or truncated"):
        load_corpus(bad)


def test_records_without_a_string_text_are_named_or_skipped_with_a_count(tmp_path):
    from probe.data.corpus import SKIP_BAD_RECORDS, load_corpus

    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "one"}\n{"text": 5}\n{"text": "two"}\n{"body": "x"}\n[1]\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:2 has a \"text\" of type int, not a string.*--skip-bad-records"):
        list(load_corpus(path).documents)  # named when the windows read that far
    corpus = load_corpus(path, skip_bad_records=True)
    with pytest.warns(UserWarning, match=r"skipping records without a string \"text\" .*\(first: .*c\.jsonl:2 "):
        assert corpus.documents == ["one", "two"]
    assert corpus.documents.skipped == 3 and "skipped (--skip-bad-records)" in corpus.source
    token = SKIP_BAD_RECORDS.set(True)  # what the CLI's --skip-bad-records sets around a verb
    try:
        with pytest.warns(UserWarning, match="skipping records"):
            assert len(load_corpus(path)) == 2
    finally:
        SKIP_BAD_RECORDS.reset(token)


def test_the_cli_names_the_bad_record(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "one two three"}\n{"text": null}\n')
    r = probe_cli("sinks", "--data", path, "--batches", "1", "--batch-size", "1", "--ctx", "4")
    assert r.returncode == 2
    assert f'{path}:2 has a "text" of type NoneType' in one_line(r.stderr)


# ---------------------------------------------------------------------------------------------------------------
# links planted below --out, damaged state files, resume fingerprints


def test_a_link_planted_as_a_subfolder_of_out_does_not_redirect_writes(tmp_path):
    from probe.jobs.store import RunStore

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "pages").symlink_to(elsewhere)
    with pytest.raises(writes.WriteError, match=r"pages is a link"):
        writes.write_files(out, {"pages/report.html": "<html>"})
    out = tmp_path / "report"
    store = RunStore(out, {"a": 1}, ["m"])
    out.mkdir()
    (out / "models").symlink_to(elsewhere)
    with pytest.raises(writes.WriteError, match=r"models is a link"):
        store.put("m", {"x": 1})
    assert list(elsewhere.iterdir()) == []  # nothing written through either link


def _store_with_one_record(out: Path):
    from probe.jobs.store import RunStore, record_path

    RunStore(out, {"a": 1}, ["m"]).put("m", {"x": 1})
    return RunStore, record_path(out, "m")


@pytest.mark.parametrize("damage", ["truncated", "not-an-object"])
def test_damaged_state_files_are_one_line_naming_the_file_and_the_way_out(tmp_path, damage):
    from probe.jobs.store import MANIFEST, RunFolderError
    from probe.train.checkpoint import read_state

    out = tmp_path / "out"
    RunStore, record = _store_with_one_record(out)
    text = record.read_text()
    record.write_text(text[: len(text) // 2] if damage == "truncated" else "[1, 2]")
    with pytest.raises(RunFolderError, match=r"models/.*\.json is corrupt .*delete it and run again"):
        RunStore(out, {"a": 1}, ["m"]).record("m")
    manifest = out / MANIFEST
    manifest.write_text(manifest.read_text()[:10] if damage == "truncated" else '"x"')
    with pytest.raises(RunFolderError, match=r"manifest.json is corrupt .*start the run over"):
        RunStore(out, {"a": 1}, ["m"])
    ckpt = tmp_path / "run" / "checkpoint"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text('{"step": 3, "sta' if damage == "truncated" else "{}")
    with pytest.raises(ValueError, match=r"trainer_state.json is corrupt .*delete .*checkpoint"):
        read_state(ckpt)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_checkpoint_tensor_file_is_one_line_naming_it(tmp_path, damage):
    import torch

    from probe.models import create
    from probe.train.checkpoint import STATE_TENSORS, load_checkpoint, load_model, save_checkpoint

    model = create("baseline", tier="tiny", seed=0)
    sampler = type("S", (), {"state_dict": lambda self: {"count": torch.tensor(3)}})()
    ckpt = save_checkpoint(tmp_path, model, torch.optim.SGD(model.parameters(), lr=0.1), sampler, step=1)
    for name in (STATE_TENSORS, "model.safetensors"):
        f = ckpt / name
        data = f.read_bytes()
        f.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x07" * 64)
        with pytest.raises(ValueError, match=rf"{name} is corrupt .*delete .*checkpoint"):
            (
                load_model(model, ckpt)
                if name == "model.safetensors"
                else load_checkpoint(ckpt, model, restore_rng=False)
            )


def test_resume_refuses_a_changed_training_corpus_naming_both_fingerprints(tmp_path, capsys):
    text, run = tmp_path / "corpus.txt", tmp_path / "run"
    text.write_text("\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog." * 3 for i in range(40)))
    argv = [
        "train",
        "--data",
        str(text),
        "--eval-data",
        str(text),
        "--ctx",
        "16",
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--eval-batches",
        "1",
        "--out",
        str(run),
        "--quiet",
        "--threads",
        "1",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    ident = json.loads((run / "probe_train.json").read_text())
    assert len(ident["corpus_sha256"]) == 64 and ident["corpus_bytes"] > 0
    capsys.readouterr()
    text.write_text(text.read_text().replace("Paragraph 3:", "Paragraph three:"))
    assert main(argv) == 2
    err = one_line(capsys.readouterr().err)
    assert "changed since the run" in err and ident["corpus_sha256"][:16] in err and "now" in err
    legacy = {k: v for k, v in ident.items() if k not in ("corpus_sha256", "corpus_bytes")}
    (run / "probe_train.json").write_text(json.dumps(legacy))  # a run written before fingerprints existed
    assert main([a for a in argv if a != "--quiet"]) == 0  # the warning is a note: none under --quiet
    assert "records no corpus fingerprint" in capsys.readouterr().err
    assert "corpus_sha256" in json.loads((run / "probe_train.json").read_text())


def test_report_resume_refuses_changed_inputs_naming_both_fingerprints(tmp_path, capsys):
    """A corpus edited between a kill and the rerun, or a model folder whose files changed, refuses the resume in
    one line instead of mixing two fingerprints in one report; a folder from before fingerprints resumes with one
    warning and records them."""
    corpus, out, model = tmp_path / "corpus.txt", tmp_path / "report", tmp_path / "model"
    corpus.write_text(
        "\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog." * 4 for i in range(24))
    )
    shutil.copytree(ZOO_MODEL, model)
    argv = [
        "report",
        "--models",
        str(model),
        "--data",
        str(corpus),
        "--ctx",
        "16",
        "--batches",
        "1",
        "--batch-size",
        "2",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    (recorded,) = list((out / "inputs").iterdir())
    fingerprint = json.loads(recorded.read_text())
    assert fingerprint["model"]["files"] >= 2 and fingerprint["windows"]["bytes"] == corpus.stat().st_size
    capsys.readouterr()
    corpus.write_text(corpus.read_text().replace("Paragraph 3:", "Paragraph three:"))
    assert main(argv) == 2
    err = one_line(capsys.readouterr().err)
    assert "computed from other inputs" in err and fingerprint["windows"]["sha256"][:16] in err and "now" in err
    recorded.unlink()  # as a folder written before fingerprints existed
    assert main(argv) == 0 and capsys.readouterr().err == ""  # --quiet: not even the warning
    recorded.unlink()
    assert main([a for a in argv if a != "--quiet"]) == 0
    assert "record no input fingerprints" in capsys.readouterr().err
    config = model / "config.json"
    config.write_text(config.read_text() + "\n")
    assert main(argv) == 2
    assert "model sha256" in one_line(capsys.readouterr().err)
