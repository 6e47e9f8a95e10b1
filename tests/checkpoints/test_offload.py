"""Big checkpoints across devices: a tiny HF model dispatched by accelerate with a ``max_memory`` that does not hold it
(decoder layers offloaded to disk, their weights on 'meta' between uses) gives the undivided model's logits, hooks and
analyses; and so does the CLI with --max-memory / --device-map."""

from __future__ import annotations

import contextlib
import io

import pandas as pd
import pytest
import torch

import probe
from probe.analyses.inject import inject
from probe.analyses.sinks import sink_stats
from probe.checkpoints.tiny import build_tiny
from probe.jobs.inputs import load_model


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    pytest.importorskip("accelerate")
    path = str(build_tiny("llama", tmp_path_factory.mktemp("llama")))
    whole = probe.load(path)
    split = probe.load(
        path, device_map="auto", max_memory={"cpu": "60KB"}, offload_folder=str(tmp_path_factory.mktemp("offload"))
    )
    return whole, split


def test_layers_are_really_offloaded(pair):
    _, split = pair
    placement = split.hf_model.hf_device_map
    assert "disk" in placement.values() and "cpu" in placement.values()
    assert any(p.device.type == "meta" for p in split.parameters())


def test_logits_and_hooks_equal_the_undivided_model(pair):
    whole, split = pair
    ids = torch.randint(2, 90, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(split(ids).logits, whole(ids).logits, rtol=0, atol=0)
    names = ["blocks.1.attn.hook_pattern", "blocks.0.attn.hook_v", "blocks.1.hook_resid_post", "hook_embed"]
    _, a = whole.run_with_cache(ids, names_filter=names)
    _, b = split.run_with_cache(ids, names_filter=names)
    for name in names:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
    # an edit through a hook propagates on the dispatched model as on the whole one
    zero_v = [("blocks.0.attn.hook_v", lambda v, hook: torch.zeros_like(v))]
    torch.testing.assert_close(
        split.run_with_hooks(ids, fwd_hooks=zero_v),
        whole.run_with_hooks(ids, fwd_hooks=zero_v),
        rtol=0,
        atol=0,
    )


def test_analyses_equal_the_undivided_model(pair):
    whole, split = pair
    windows = torch.randint(2, 90, (2, 2, 17), generator=torch.Generator().manual_seed(1))
    for name in ("layers", "heads"):
        torch.testing.assert_close(
            torch.tensor(sink_stats(split, windows)[name].select_dtypes("number").values),
            torch.tensor(sink_stats(whole, windows)[name].select_dtypes("number").values),
            rtol=1e-12,
            atol=1e-12,
            equal_nan=True,
        )
    got = inject(split, windows, junk=("structured", "gaussian"), doses=(0.4,), progress=False)["results"]
    want = inject(whole, windows, junk=("structured", "gaussian"), doses=(0.4,), progress=False)["results"]
    torch.testing.assert_close(
        torch.tensor(got["delta"].values), torch.tensor(want["delta"].values), rtol=1e-12, atol=1e-12
    )
    assert (want["delta"].abs() > 0).all()  # the injection did something to compare


# ------------------------------------------------------------------------------------------------------------ the CLI

WINDOWS = ["--batches", "2", "--batch-size", "2", "--ctx", "17", "--quiet"]


def cli(*argv) -> tuple[int, str]:
    """``probe ARGV`` in this process: (exit code, stderr)."""
    from probe.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, err.getvalue()


def test_cli_on_a_model_split_over_cpu_and_disk_equals_the_whole_model(tmp_path, monkeypatch, caplog):
    """`probe sinks|inject --max-memory cpu=60KB` (so --device-map auto) puts the tiny llama's layers on disk and
    writes the undivided model's tables; --quiet prints nothing (not accelerate's offload warning either), and without
    it probe says where the modules went."""
    pytest.importorskip("accelerate")
    import probe.cli.prepare as analyses  # where the analysis verbs load their model

    loaded = []  # the models the verbs ran on, to see where their weights were
    monkeypatch.setattr(analyses, "load_model", lambda *a: loaded.append(load_model(*a)) or loaded[-1])
    path = build_tiny("llama", tmp_path / "llama")
    words = torch.randint(2, 90, (600,), generator=torch.Generator().manual_seed(2))
    (tmp_path / "words.txt").write_text(" ".join(f"w{int(i)}" for i in words))
    common = ["--model", path, "--data", tmp_path / "words.txt", *WINDOWS]
    for verb, extra in (("sinks", []), ("inject", ["--junk", "structured", "gaussian", "--dose", "0.4"])):
        assert cli(verb, *common, *extra, "--out", tmp_path / "whole" / verb) == (0, "")
        offload = tmp_path / "offload" / verb
        assert cli(
            verb,
            *common,
            *extra,
            "--max-memory",
            "cpu=60KB",
            "--offload-dir",
            offload,
            "--out",
            tmp_path / "split" / verb,
        ) == (0, "")
        placement = loaded[-1].hf_model.hf_device_map
        assert {"cpu", "disk"} <= set(placement.values()), placement
        assert getattr(loaded[-2].hf_model, "hf_device_map", None) is None  # the reference is undivided
        tables = sorted(p.name for p in (tmp_path / "whole" / verb).glob("*.csv"))
        assert tables == sorted(p.name for p in (tmp_path / "split" / verb).glob("*.csv")) and len(tables) > 3
        for name in tables:
            want, got = (pd.read_csv(tmp_path / run / verb / name) for run in ("whole", "split"))
            assert len(want) > 0, name
            pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12, atol=1e-12, obj=name)
    assert not [r for r in caplog.records if r.name.startswith("accelerate")], caplog.records
    loud = [a for a in common if a != "--quiet"]
    rc, err = cli("sinks", *loud, "--max-memory", "cpu=60KB", "--out", tmp_path / "loud")
    assert rc == 0 and "placement: --device-map auto: " in err and " on disk" in err, err


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--device-map", "fast"], ["--device-map", "'fast'", "auto, balanced, balanced_low_0, sequential, cpu"]),
        (["--max-memory", "cpu=lots"], ["--max-memory", "'lots'", "GiB"]),
        (["--max-memory", "gpu=1GB"], ["--max-memory", "'gpu'", "cpu, disk, mps"]),
        (["--max-memory", "7=1GB"], ["--max-memory", "GPU 7", "use cpu, disk"]),
        (["--device", "cpu", "--device-map", "auto"], ["--device 'cpu'", "--device-map", "give one"]),
    ],
)
def test_bad_placement_flags_are_one_line_exit_2(flags, needles):
    if "7=1GB" in flags and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a GPU 7")
    rc, err = cli("sinks", *flags, *WINDOWS)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and err.startswith("probe sinks: error: "), err
    for needle in needles:
        assert needle in err, (needle, err)


def test_pretrained_recipes_take_the_placement_flags(tmp_path):
    """The pretrained recipes read --device-map / --max-memory like the verbs: a bad value is one exit-2 line before
    any model loads (nothing written)."""
    from probe.experiments.command import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(
            [
                "pretrained-sinks",
                "--out",
                str(tmp_path / "out"),
                "--models",
                "probe/tiny-baseline",
                "--max-memory",
                "cpu=lots",
            ]
        )
    assert rc == 2 and len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
    assert "--max-memory" in err.getvalue() and "'lots'" in err.getvalue()
    assert not (tmp_path / "out").exists()


def test_a_temporary_offload_folder_lives_as_long_as_the_model(tmp_path):
    """Without --offload-dir accelerate gets a temporary folder for the weights it offloads (from safetensors it reads
    them in place, so the folder may stay empty): the folder is there while the model is, and removed after it."""
    import gc
    import tempfile
    from pathlib import Path

    from probe.console import Console
    from probe.jobs.specs import ModelSpec

    pytest.importorskip("accelerate")
    path = str(build_tiny("llama", tmp_path / "llama"))
    folders = lambda: set(Path(tempfile.gettempdir()).glob("probe-offload-*"))  # noqa: E731
    before = folders()
    model = load_model(ModelSpec(name=path, max_memory={"cpu": 60_000}), Console(quiet=True))
    (folder,) = folders() - before
    gc.collect()
    assert folder.is_dir() and "disk" in model.hf_model.hf_device_map.values()
    model(torch.randint(2, 90, (1, 8)))
    assert folder.is_dir()
    del model
    gc.collect()
    assert not folder.exists()
