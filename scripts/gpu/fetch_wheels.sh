#!/usr/bin/env bash
# Wheels the lent GPU machine lacks (it has no network), for scripts/gpu/check.sh: run here, once, from the repo root;
# `.whl/` is git-ignored and travels with `carry: [".whl"]` (at most 64 MiB, checked below). The image has torch,
# triton, einops and transformers; the kernel suite adds fla-core (fla's parallel_attn, pure Python + Triton).
# EXTRA="pkg==ver ..." downloads more (e.g. for ZOO_STEPS > 0: transformer-lens datasets dill multiprocess).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
py=${PYTHON:-python3}
FLA_VERSION=${FLA_VERSION:-0.6.0}
# shellcheck disable=SC2086  # EXTRA is a word list
for p in "fla-core==$FLA_VERSION" ${EXTRA:-}; do
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d .whl "$p"
done
size=$(du -sm .whl | cut -f1)
ls -la .whl
if [ "$size" -gt 64 ]; then
    echo "fetch_wheels.sh: .whl/ is ${size} MiB, over the 64 MiB a device run can carry" >&2
    exit 1
fi
echo ".whl/: ${size} MiB"
