"""docs/how-to/adding-a-mechanism.md#a-depth-mechanism, followed to the letter: a toy depth mechanism (a uniform average
over the sources a read site sees) is one new module and one catalogue entry. They are written into a scratch copy of
the package, which then differs from it in exactly those two files, and there `probe models`, `probe train` and
`probe sources` (the effective sources and the depth heatmap) run on it end to end. The shipped package never sees it.
A dense mix is added the same way through ``@register_dense`` (in-process here) and ``probe sources``' dense-weight
analysis and heatmaps read it."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from probe.models import DENSES, DEPTHS, VARIANTS, DenseMix, add_variant, create, register_dense
from tests.support import SMALL

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "how-to" / "adding-a-mechanism.md"

# the module of the guide's step 1, written as probe/models/depth_mechanisms/uniform.py
MODULE = '''"""A uniform read: every site averages the sources it sees (a toy depth mechanism, no parameters)."""

from probe.models.depth import DepthRead, register_depth


@register_depth("uniform")
class UniformRead(DepthRead):
    """α_i = 1/S over the S sources a site reads."""

    def forward(self, sources):
        values, _ = sources.current()  # S tensors B,T,d: the embedding, the sub-layer outputs or blocks so far
        B, T, _ = values[0].shape
        weights = values[0].new_full((B, T, len(values)), 1 / len(values))  # B,T,S
        return self.read(weights, values)  # fires hook_depth_weights (a hook may edit α), then Σ_i α_i o_i
'''
# the guide's step 2: its entry in probe/catalogue.py's VARIANTS
ENTRY = (
    "    "
    + '"uniform-block{N}": Variant("uniform average over the sources of N blocks (a toy)", dict(depth="uniform")),\n'
)

VARIANTS_OPEN = "VARIANTS: dict[str, Variant] = {\n"

# in the copy: the CLI as a user runs it (probe.cli.main), in one interpreter to import torch once
SCRIPT = """
import sys
from probe.cli import main
from probe.models import DEPTHS
run, out = sys.argv[1], sys.argv[2]
assert "uniform" in DEPTHS, DEPTHS
assert main(["models"]) == 0
train = ["train", "--variant", "uniform-block3", "--steps", "3", "--batch-size", "4", "--ctx", "32", "--warmup", "1",
         "--eval-every", "0", "--ckpt-every", "0", "--eval-batches", "1", "--data", "wikitext-2-valid"]
assert main(train + ["--out", run, "--quiet"]) == 0
assert main(["sources", "--model", run, "--batches", "1", "--batch-size", "2", "--ctx", "32", "--out", out,
             "--quiet"]) == 0
"""


def _files(package: Path) -> dict[str, Path]:
    """The package's files as a contributor edits them (no bytecode, no zoo checkpoints), by path from its parent."""
    return {
        p.relative_to(package.parent).as_posix(): p
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.relative_to(package).parts[0] != "zoo"
    }


def touched(original: Path, copy: Path) -> set[str]:
    """Files added, removed or changed in the package ``copy`` against the package ``original``."""
    a, b = _files(original), _files(copy)
    return (set(a) ^ set(b)) | {n for n in set(a) & set(b) if not filecmp.cmp(a[n], b[n], shallow=False)}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A copy of the package with the guide's two steps applied: (copy root, files touched)."""
    tree = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "probe", tree / "probe", ignore=shutil.ignore_patterns("__pycache__", "zoo"))
    (tree / "probe" / "models" / "depth_mechanisms" / "uniform.py").write_text(MODULE)  # step 1: the module
    catalogue = tree / "probe" / "catalogue.py"
    text = catalogue.read_text()
    assert text.count(VARIANTS_OPEN) == 1
    catalogue.write_text(text.replace(VARIANTS_OPEN, VARIANTS_OPEN + ENTRY))  # step 2: its catalogue entry
    return tree, touched(ROOT / "probe", tree / "probe")


def test_the_guide_shows_the_module_and_the_entry_this_test_writes():
    guide = GUIDE.read_text()
    assert MODULE.strip() in guide and ENTRY.strip() in guide


def test_a_depth_mechanism_is_one_module_and_one_catalogue_entry(scratch):
    _, files = scratch
    assert files == {"probe/models/depth_mechanisms/uniform.py", "probe/catalogue.py"}
    assert "uniform" not in DEPTHS and "uniform-block{N}" not in VARIANTS  # the shipped package does not have it
    assert not (ROOT / "probe" / "models" / "depth_mechanisms" / "uniform.py").exists()


def test_probe_train_and_probe_sources_run_on_the_new_mechanism(scratch, tmp_path):
    tree, _ = scratch
    run, out = tmp_path / "run", tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("PROBE_BACKEND", None)
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(run), str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "uniform-block{N}" in r.stdout  # `probe models` lists it with its description
    assert "uniform average over the sources of N blocks (a toy)" in r.stdout
    config = json.loads((run / "model" / "config.json").read_text())
    assert (config["depth"], config["depth_blocks"]) == ("uniform", 3)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses and np.isfinite(losses).all()

    # tiny tier: 6 layers, 12 sub-layers in 3 blocks of 4; site t reads the embedding, the completed blocks and the
    # partial block of the t-1 sub-layers written before it
    written = range(1, 13)
    n_sources = [1 + w // 4 + (w % 4 > 0) for w in written]
    sites = pd.read_csv(out / "sources_sites.csv")
    assert sites["n_sources"].tolist() == n_sources and sites["site"].iloc[-1] == "final_read"
    np.testing.assert_allclose(sites["neff_mean"], n_sources, rtol=1e-6)  # uniform: N_eff = S, every token alike
    np.testing.assert_allclose(sites["top1_mass"], 1 / np.array(n_sources), rtol=1e-6)
    np.testing.assert_allclose(sites["input_dependence"], 0, atol=1e-9)
    np.testing.assert_allclose(sites["neff_std"], 0, atol=1e-5)
    masses = sites["mass_embedding"] + sites["mass_blocks"] + sites["mass_partial"]
    np.testing.assert_allclose(masses, 1, rtol=1e-6)
    summary = pd.read_csv(out / "sources_summary.csv").iloc[0]
    assert summary["S_src"] == sum(n for n in n_sources if n >= 2) and summary["mode"] == "block"

    heat = pd.read_csv(out / "sources_heatmap.csv").set_index("site")
    assert list(heat.columns[-4:]) == ["block1", "block2", "block3", "partial"]
    cells = heat[["embed", "block1", "block2", "block3", "partial"]].to_numpy()
    for row, n in zip(cells, n_sources):
        read = row[~np.isnan(row)]
        assert len(read) == n
        np.testing.assert_allclose(read, 1 / n, rtol=1e-6)  # each cell the site reads is 1/S, the rest empty
    page = (out / "sources.html").read_text()
    assert "Mean depth weights" in page and "Effective number of sources" in page  # the heatmap and N_eff figures


# A dense mix: the same route through @register_dense (in-process: the fixture registers it and takes it away again)
class UniformMix(DenseMix):
    """After block l, the next block reads the mean of X_0 .. X_{l+1}: A = 1/S, one stream, no parameters."""

    def weights(self, x):  # x: B,T,d -> A: B,T,C,S
        B, T, _ = x.shape
        return x.new_full((B, T, self.streams, self.n_src), 1 / self.n_src)


@pytest.fixture
def uniform_mix():
    register_dense("uniform-mix")(UniformMix)
    add_variant("uniformmix", "mean of all earlier block states after each block", dense="uniform-mix")
    yield
    DENSES.pop("uniform-mix")
    VARIANTS.pop("uniformmix")


def test_a_new_dense_mix_is_read_by_the_dense_weight_analysis_and_heatmaps(uniform_mix):
    from probe.analyses.sources import dense_weights
    from probe.present.sources import dense_heatmaps

    model = create("uniformmix", **SMALL, vocab_size=97)
    ids = torch.randint(0, 97, (2, 3, 17), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(ids[0])
    x0, x1 = cache["hook_embed"], cache["blocks.0.hook_resid_post"]
    torch.testing.assert_close(cache["blocks.1.hook_resid_pre"], (x0 + x1) / 2)  # block 1 reads the mean
    result = dense_weights(model, ids)
    layers = result["dense_layers"]
    assert layers["n_sources"].tolist() == [2, 3] and (layers["stream"] == "r").all()
    np.testing.assert_allclose(layers["weight_sum"], 1, rtol=1e-6)
    np.testing.assert_allclose(layers["latest_weight"], [1 / 2, 1 / 3], rtol=1e-6)
    np.testing.assert_allclose(result["dense_weights"]["weight_std"], 0, atol=1e-7)
    (figure,) = dense_heatmaps(result)  # source block state (rows: embed, block0, block1) x mix after block l
    expected = [[1 / 2, 1 / 3], [1 / 2, 1 / 3], [np.nan, 1 / 3]]
    np.testing.assert_allclose(np.array(figure.data[0].z, dtype=float), expected, rtol=1e-6)
