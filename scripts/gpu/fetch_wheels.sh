#!/usr/bin/env bash
# Wheels the lent GPU machine lacks (it has no network): run here, once, from the repo root; `.whl/` is git-ignored and
# travels with `carry: [".whl"]`. The image has torch 2.11, triton 3.6, transformers 5.17, pandas, einops, jaxtyping,
# pyarrow, xxhash; importing transformer_lens also needs datasets, dill and multiprocess. transformers is
# carried at the version CI tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
py=${PYTHON:-python3}
ver() { "$py" -c "import importlib.metadata as m; print(m.version('$1'))"; }
pkgs=(transformer-lens datasets dill multiprocess transformers)
for p in "${pkgs[@]}"; do
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "$p==$(ver "$p")"
done
du -sh .whl && ls .whl
