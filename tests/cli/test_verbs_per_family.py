"""Every model verb of the CLI, in process, on a saved tiny folder of one model_type per adapter family of the
coverage table (tests/support/verbs.py): each verb exits 0 and writes its tables, or refuses in one line because the
model lacks what it measures (``gates`` without a gate, ``sources`` without depth routing). The regeneration of the
table (``-m slow``) runs the same verbs on every supported type; this file and test_verbs_per_family_more.py (one
half each, for pytest-xdist's one file per worker) run one type per family in CI, on two small text files instead of
the bundled corpora (whose tokenization, the same for every family, cost half of each family's time)."""

from __future__ import annotations

import pytest

from probe.checkpoints import architectures
from tests.support import verbs

TABLE = architectures.table()
PREFERRED = ("llama", "gpt2", "olmo2", "gemma3_text", "qwen3_next", "mixtral", "falcon", "bloom", "lfm2")


# the text model of a multimodal family that no auto class loads from its own folder (emu3, mllama): HF cannot
# reload a saved one, so no verb can be given one (the table records no saved-folder check for them either)
UNSAVABLE = {mt for mt, r in TABLE["types"].items() if r["status"] != "refused" and "saved_fp64" not in r["parity"]}


def one_type_per_family() -> list[str]:
    """For each adapter of a supported or partial type that a saved folder can be given for: a type the issue
    names where the family has one, else its first type by name."""
    families: dict[str, list[str]] = {}
    for mt, r in sorted(TABLE["types"].items()):
        if r["status"] != "refused" and mt not in UNSAVABLE:
            families.setdefault(r["adapter"], []).append(mt)
    return sorted(next((mt for mt in PREFERRED if mt in types), types[0]) for types in families.values())


def shard(index: int) -> list[str]:
    return one_type_per_family()[index::2]


def check_every_verb(model_type: str, tmp_path) -> None:
    folder = verbs.save_tiny(model_type, tmp_path / model_type)
    outcomes = verbs.run_every_verb(folder, small_texts=True)  # the model's paths, not the corpora's (tested apart)
    assert verbs.failures(outcomes) == [], (model_type, outcomes)
    assert outcomes["sinks"] == outcomes["inject"] == outcomes["view"] == "ok"


def test_one_type_per_family_covers_every_family():
    families = {r["adapter"] for mt, r in TABLE["types"].items() if r["status"] != "refused" and mt not in UNSAVABLE}
    assert {TABLE["types"][mt]["adapter"] for mt in one_type_per_family()} == families and len(families) >= 30
    assert UNSAVABLE == {"emu3", "mllama"}


def test_the_check_can_fail(tmp_path, monkeypatch):
    """A verb whose analysis raises is a failure, a verb's one-line refusal for a lacking mechanism is not."""
    import probe.analyses.capture as capture

    folder, texts = verbs.save_tiny("llama", tmp_path / "llama"), verbs.text_files(tmp_path)
    assert verbs.run_verb("eval", folder, tmp_path / "e0", texts) == "ok"
    outcome = verbs.run_verb("sources", folder, tmp_path / "s", texts)
    assert outcome.startswith("n/a: ") and "depth routing" in outcome

    def broken(*_a, **_k):
        raise RuntimeError("boom")

    monkeypatch.setattr(capture, "window_losses", broken)
    outcome = verbs.run_verb("eval", folder, tmp_path / "e1", texts)
    assert outcome.startswith("failed: exit 1"), outcome
    assert verbs.failures({"eval": outcome}) == [f"eval: {outcome.removeprefix('failed: ')}"]


@pytest.mark.parametrize("model_type", shard(0))
def test_every_verb_runs(model_type, tmp_path):
    check_every_verb(model_type, tmp_path)
