#!/usr/bin/env bash
# One prepared GPU session (~10 minutes on the lent H200): Triton kernels against the references on CUDA, the kernel benchmark,
# then the zoo trained on the GPU and packed for the trip back. Run through the device tool from the repo root:
#   scripts/gpu/fetch_wheels.sh            # here, once
#   run(carry=[".whl"], timeout_s=600, command="bash scripts/gpu/check.sh")
# Environment: ZOO_STEPS (default 6000; 0 skips the zoo), ZOO_BATCH (32), ZOO_LR (3e-3), ZOO_JOBS (12), ZOO_VARIANTS
# (all), ZOO_DEVICE (cuda), SKIP_TESTS. The GPU machine has no network: the zoo trains on the bundled mix.
# Back under $OUT: gpu.txt, kernel_tests.log, kernels.txt, imports.log, model_tests.log, zoo.log and zoo.tgz.part-*
# (the shipped directories, ~53 MB; their zoo.json losses are measured on the CPU in fp32 as always); here:
# cat zoo.tgz.part-* | tar xz -C probe/zoo, then `probe sinks --model probe/tiny-baseline` and the test suite
# (tests/test_zoo.py reproduces each loss here).
# The steps needing only torch + triton come first, each its own pytest run, so that a carried wheel that does not
# fit the image's packages cannot cost the kernel results.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD" TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1; cat "$OUT/gpu.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_triton.py -m "gpu or not slow" 2>&1 \
        | tail -n 40 > "$OUT/kernel_tests.log"
    timeout 60 python3 benchmarks/kernels.py --T 2048 > "$OUT/kernels.txt" 2>&1
fi
# transformers is carried at CI's version; if it does not import against the image's huggingface_hub & co., fall back
# to the image's own transformers (TransformerLens 4.3 needs >= 5.9; the image has 5.17).
imports="import transformers, transformer_lens, probe.models, probe.train.zoo; print('transformers', transformers.__version__)"
if ! python3 -c "$imports" > "$OUT/imports.log" 2>&1; then
    echo "carried transformers failed to import; retrying with the image's" >> "$OUT/imports.log"
    rm -rf /tmp/site/transformers /tmp/site/transformers-*.dist-info
    python3 -c "$imports" >> "$OUT/imports.log" 2>&1 || { cat "$OUT/imports.log"; ls -la "$OUT"; exit 1; }
fi
cat "$OUT/imports.log"
if [ -z "${SKIP_TESTS:-}" ]; then
    timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_model_backends.py -m "gpu or not slow" 2>&1 \
        | tail -n 40 > "$OUT/model_tests.log"
fi
if [ "${ZOO_STEPS:-6000}" != 0 ]; then
    variants=${ZOO_VARIANTS:-}
    timeout 420 python3 -m probe.train.zoo ${variants:+--variants $variants} --steps "${ZOO_STEPS:-6000}" \
        --batch-size "${ZOO_BATCH:-32}" --lr "${ZOO_LR:-3e-3}" --jobs "${ZOO_JOBS:-12}" --device "${ZOO_DEVICE:-cuda}" \
        --work /tmp/zoo-runs --zoo-dir /tmp/zoo 2>&1 | tee "$OUT/zoo.log"
    tar czf - -C /tmp/zoo . | split -b 15M - "$OUT/zoo.tgz.part-"
fi
ls -la "$OUT"
