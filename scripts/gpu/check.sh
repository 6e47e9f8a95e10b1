#!/usr/bin/env bash
# One prepared GPU session (SPEC §7; ~10 minutes): Triton kernels against the references on CUDA, the kernel benchmark,
# then the zoo trained on the GPU and packed for the trip back. Run through the device tool from the repo root:
#   scripts/gpu/fetch_wheels.sh            # here, once
#   run(carry=[".whl"], timeout_s=600, command="bash scripts/gpu/check.sh")
# Environment: ZOO_STEPS (default 6000), ZOO_BATCH (32), ZOO_LR (3e-3), ZOO_JOBS (12), ZOO_VARIANTS (all), SKIP_TESTS.
# Back under $OUT: gpu.txt, tests.log, kernels.txt, zoo.log and zoo.tgz.part-* (the shipped directories, ~53 MB; their
# zoo.json losses are measured on the CPU in fp32 as always); here: cat zoo.tgz.part-* | tar xz -C probe/zoo, then
# `probe sinks --model probe/tiny-baseline` and the test suite (tests/test_zoo.py reproduces each loss here).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD" TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
    timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels_triton.py tests/test_model_backends.py \
        -m "gpu or not slow" 2>&1 | tail -n 40 > "$OUT/tests.log"
    timeout 60 python3 benchmarks/kernels.py --T 2048 > "$OUT/kernels.txt" 2>&1
fi
variants=${ZOO_VARIANTS:-}
timeout 420 python3 -m probe.train.zoo ${variants:+--variants $variants} --steps "${ZOO_STEPS:-6000}" \
    --batch-size "${ZOO_BATCH:-32}" --lr "${ZOO_LR:-3e-3}" --jobs "${ZOO_JOBS:-12}" --device cuda \
    --work /tmp/zoo-runs --zoo-dir /tmp/zoo 2>&1 | tee "$OUT/zoo.log"
tar czf - -C /tmp/zoo . | split -b 15M - "$OUT/zoo.tgz.part-"
ls -la "$OUT"
