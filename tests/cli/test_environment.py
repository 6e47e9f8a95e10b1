"""A broken optional dependency (importable, raising on use) degrades to its fallback with one warning instead of a
traceback (probe.optional): Triton for `probe doctor` and the analyses, kaleido for notebook images, gguf for .gguf
models; `probe doctor --arch` says so and exits 1 when the compile it was asked for cannot run. The fakes are packages
put first on PYTHONPATH of a subprocess (the real ones stay installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.cli import ENV, REPO, WINDOWS, assert_one_line_error, probe, terminal_lines


def fakes(tmp_path, *names, importable=True) -> dict:
    """PYTHONPATH with a package per name that imports but raises on every attribute (``importable``), or that raises
    on import."""
    root = tmp_path / "fakes"
    for name in names:
        (root / name).mkdir(parents=True)
        body = (
            f"__version__ = '9.9.9'\n\ndef __getattr__(attr):\n    raise RuntimeError('{name} is broken here')\n"
            if importable
            else f"raise RuntimeError('{name} is broken here (libcuda.so not found)')\n"
        )
        (root / name / "__init__.py").write_text(body)
    return {"PYTHONPATH": os.pathsep.join([str(root), str(REPO)])}


def test_doctor_with_a_broken_triton_and_gguf_reports_them_and_arch_cannot_run(tmp_path):
    """A broken Triton ended `probe doctor` in a traceback; `--arch sm_90` without Triton printed "ok", exit 0."""
    r = probe("doctor", "--no-interpreter", "--arch", "sm_90", env=fakes(tmp_path, "triton", "gguf"))
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    err = terminal_lines(r.stderr)
    assert len(err) == 2, err
    assert err[0].startswith("probe doctor: warning: triton is installed but broken (")
    assert "every op runs its torch path" in err[0]
    assert err[1].startswith("probe doctor: --arch sm_90: the ahead-of-time compile needs Triton")
    assert "triton is installed but broken" in r.stdout and "gguf is installed but broken" in r.stdout
    assert not r.stdout.rstrip().endswith("ok")


def test_an_analysis_with_a_triton_that_fails_at_import_falls_back_with_one_warning(tmp_path):
    r = probe("sinks", *WINDOWS, "--json", env=fakes(tmp_path, "triton", importable=False))
    assert r.returncode == 0, r.stderr[-3000:]
    warnings = [line for line in terminal_lines(r.stderr) if "warning" in line]
    assert len(warnings) == 1 and "triton is installed but broken (RuntimeError" in warnings[0]
    assert '"tables"' in r.stdout


@pytest.mark.skipif(not shutil.which("chromium"), reason="static images are tried only where a Chromium is")
def test_a_broken_kaleido_leaves_figures_interactive_with_one_warning(tmp_path):
    code = "from probe.present.viewers import static_images; print(static_images())"
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**ENV, **fakes(tmp_path, "kaleido")}
    )
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
    assert len(terminal_lines(r.stderr)) == 1 and "kaleido is installed but broken" in r.stderr


def test_a_gguf_model_without_a_working_gguf_package_is_one_line(tmp_path, monkeypatch, capsys):
    from probe import optional
    from probe.cli.main import main

    monkeypatch.setitem(optional._status, "gguf", "broken (RuntimeError: gguf is broken here)")
    monkeypatch.setenv("PROBE_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    code = main(["sinks", "--model", str(model), *WINDOWS, "--quiet"])
    r = subprocess.CompletedProcess([], code, *capsys.readouterr())
    assert_one_line_error(r, "needs the gguf package, which is broken (RuntimeError: gguf is broken here)")
