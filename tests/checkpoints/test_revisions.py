"""OLMo 2's intermediate checkpoints by step: ``@stepN`` resolves through probe/checkpoints/revisions.json to the
published branch name, which the local Hugging Face cache (a revision folder per branch) then serves offline."""

from __future__ import annotations

import pytest
import torch

import probe
from probe.checkpoints.load import REVISIONS, ModelNotFoundError, resolve
from probe.checkpoints.tiny import build_tiny

REPO = "allenai/OLMo-2-0425-1B-early-training"


def test_the_table_holds_published_branch_names_only():
    import re

    for repo, suite in REVISIONS.items():
        assert repo.startswith("allenai/OLMo-2-") and suite["sources"]
        for step, branch in suite["steps"].items():
            m = re.fullmatch(r"stage1-step(\d+)-tokens(\d+)B", branch)
            assert m and m.group(1) == step


@pytest.mark.parametrize(
    "name, branch",
    [
        ("olmo-2-0425-1b-early-training@step1000", "stage1-step1000-tokens3B"),
        ("allenai/OLMo-2-0425-1B-early-training@2000", "stage1-step2000-tokens5B"),
        ("olmo-2-1124-7b@step928646", "stage1-step928646-tokens3896B"),
        ("olmo-2-1124-7b@stage1-step5-tokens1B", "stage1-step5-tokens1B"),  # a branch name passes as it is
        ("olmo-2-0425-1b", None),
    ],
)
def test_step_resolves_to_the_branch(name, branch):
    assert resolve(name)[1] == branch


def test_a_step_without_a_published_branch_is_one_line():
    with pytest.raises(ModelNotFoundError, match="nearest: step10000, step20000, step23100") as e:
        resolve("olmo-2-0425-1b@step12345")
    assert "\n" not in str(e.value) and "@stage1-step10000-tokens21B" in str(e.value)


def _cache_revision(cache, branch: str, commit: str, seed: int):
    """A revision folder as huggingface_hub keeps one: refs/<branch> naming snapshots/<commit>/."""
    root = cache / ("models--" + REPO.replace("/", "--"))
    build_tiny("olmo2", root / "snapshots" / commit, seed=seed)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / branch).write_text(commit)


def test_two_steps_load_from_their_local_revision_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _cache_revision(tmp_path, "stage1-step1000-tokens3B", "a" * 40, seed=1)
    _cache_revision(tmp_path, "stage1-step2000-tokens5B", "b" * 40, seed=2)
    x = torch.randint(2, 90, (1, 8), generator=torch.Generator().manual_seed(0))
    models = [probe.load(f"olmo-2-0425-1b-early-training@step{s}", cache_dir=str(tmp_path)) for s in (1000, 2000)]
    assert [m.probe_info.extra["revision"] for m in models] == ["stage1-step1000-tokens3B", "stage1-step2000-tokens5B"]
    assert [m.probe_info.name for m in models] == [
        f"{REPO}@stage1-step1000-tokens3B",
        f"{REPO}@stage1-step2000-tokens5B",
    ]
    with torch.no_grad():
        assert (models[0](x).logits - models[1](x).logits).abs().max() > 1e-3  # two checkpoints, not one twice
    assert models[0].family == "olmo2" and "hook_resid_mid" not in models[0].probe_info.absent_hooks
