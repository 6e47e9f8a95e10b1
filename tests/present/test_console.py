"""Progress and numbers on the terminal: plain lines (no carriage returns, no escape codes) when stderr is not a
terminal; "1 batch", "2 batches"."""

from __future__ import annotations

import io

import pytest

from probe.cli.main import main
from probe.progress import PlainProgress, plural, progress_bar


def test_plural_and_counts():
    assert plural(1, "batch") == "1 batch" and plural(2, "batch") == "2 batches"
    assert plural(0, "window") == "0 windows" and plural(1024, "token") == "1,024 tokens"
    assert plural(3, "index", "indices") == "3 indices"


def test_piped_progress_is_plain_lines(capsys):
    bar = progress_bar(20, "work", unit="batch")  # capsys' stderr is not a terminal
    assert isinstance(bar, PlainProgress)
    bar.min_interval = 0  # a line at every tenth however fast the work is
    for _ in range(20):
        bar.update()
    bar.set_postfix(loss="1.234")
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    lines = err.splitlines()
    assert lines[0] == "work: 2/20 batches" and lines[-1] == "work: 20/20 batches (loss=1.234)" and len(lines) == 10
    assert progress_bar(5, "quiet", enabled=False).__class__.__name__ == "_Silent"


def test_silent_and_erased_bars_print_nothing():
    out = io.StringIO()
    bar = PlainProgress(3, "x", unit="step", file=out)
    bar.update(3)
    bar.close()
    bar.close()  # closing twice prints once
    assert out.getvalue() == "x: 3/3 steps\n"


@pytest.mark.parametrize("verb", ["eval"])
def test_a_verb_piped_to_a_file_leaves_no_escape_codes(verb, tmp_path, capsys):
    rc = main([verb, "--batches", "1", "--batch-size", "1", "--ctx", "16", "--threads", "1"])
    err = capsys.readouterr().err
    assert rc == 0 and "\r" not in err and "\x1b" not in err, err
    assert "plan: eval" in err and "1 batch x 1 window x 16 tokens" in err


def test_probe_models_shows_each_zoo_models_validation_loss_not_its_path(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    zoo = out.split("zoo (")[1].split("\n\n")[0]
    line = next(l for l in zoo.splitlines() if l.strip().startswith("probe/tiny-baseline "))
    assert "val loss 5.390 on wikitext-2-test (baseline, 600 steps)" in line  # probe/zoo/tiny-baseline/zoo.json
    assert "/zoo/" not in zoo and "probe/bb-baseline" in zoo


def test_summary_lines_put_the_standard_error_beside_its_value_and_say_n_a():
    from probe.present.terminal import summary_lines as _summary_lines

    row = {
        "token_share": 0.98861,
        "token_share_se": 0.000457,
        "token_share_min_count": float("nan"),
        "token_share_min_count_se": float("nan"),
        "mean_gate": 0.4662,
        "mean_gate_se": float("nan"),
        "gate": "proj",
    }
    assert _summary_lines(row, ["gate", "mean_gate", "token_share", "token_share_min_count", "absent"]).split("\n") == [
        "  gate                   proj",
        "  mean_gate              0.4662",
        "  token_share            0.9886 ± 0.00046",
        "  token_share_min_count  n/a",
    ]
