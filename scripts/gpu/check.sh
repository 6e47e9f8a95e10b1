#!/usr/bin/env bash
# One prepared GPU session (<= 5 minutes on one H200): `probe doctor` (each kernel against its reference, launch
# settings on this GPU), then the kernel suite (benchmarks/kernels_gpu.py: against SDPA, FlexAttention and, when its
# wheel was carried, fla's parallel_attn, T = 1k ... 16k), then the GPU-marked kernel tests and the other kernel tests'
# Triton cases (on CUDA there). Run from the repo root:
#   scripts/gpu/fetch_wheels.sh            # here, once: fla-core into .whl/ (git-ignored)
#   scripts/gpu/slim_tree.sh off           # the tracked tree (~104 MB) is over the 64 MiB a run carries
#   run(carry=[".whl"], timeout_s=420, command="bash scripts/gpu/check.sh")
#   scripts/gpu/slim_tree.sh on            # before the next commit
# Each section writes its result under $OUT as soon as it finishes (gpu.txt, doctor.txt, bench/<section>.txt and
# .jsonl, kernel_tests.log, triton_tests.log), so a run cut short still returns what it measured.
# Environment: T (sequence lengths, default "1024 2048 4096 8192 16384"), SECTIONS (default "sink fla masses depth"),
# SKIP_TESTS, ZOO_STEPS (default 0: the zoo is opt-in; > 0 trains it after everything else, see probe.train.zoo,
# with ZOO_BATCH, ZOO_LR, ZOO_JOBS, ZOO_VARIANTS).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD" TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/bench"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        > "$OUT/wheels.log" 2>&1 || echo "carried wheels did not install (see wheels.log); fla is skipped" >> "$OUT/wheels.log"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1; cat "$OUT/gpu.txt"

timeout 120 python3 -m probe.cli doctor > "$OUT/doctor.txt" 2>&1
echo "probe doctor exit code $?" >> "$OUT/doctor.txt"; cat "$OUT/doctor.txt"

# shellcheck disable=SC2086  # T and SECTIONS are word lists
timeout 150 python3 benchmarks/kernels_gpu.py --out "$OUT/bench" --T ${T:-1024 2048 4096 8192 16384} \
    --sections ${SECTIONS:-sink fla masses depth} > "$OUT/bench/all.txt" 2>&1
echo "kernel suite exit code $?" >> "$OUT/bench/all.txt"; tail -n 60 "$OUT/bench/all.txt"

if [ -z "${SKIP_TESTS:-}" ]; then
    timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts= tests/kernels/test_sink_attention.py \
        tests/kernels/test_depth_attention.py -m gpu 2>&1 \
        | tail -n 40 > "$OUT/kernel_tests.log"; cat "$OUT/kernel_tests.log"
    # the other kernel tests' Triton cases, on CUDA here (the row rules' kernels have never run on a GPU)
    timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts= tests/kernels/test_rule_triton.py \
        tests/kernels/test_row_masses.py tests/kernels/test_sink_attention_edits.py -k triton \
        2>&1 | tail -n 40 > "$OUT/triton_tests.log"; cat "$OUT/triton_tests.log"
fi

if [ "${ZOO_STEPS:-0}" != 0 ]; then
    variants=${ZOO_VARIANTS:-}
    timeout 420 python3 -m probe.train.zoo ${variants:+--variants $variants} --steps "$ZOO_STEPS" \
        --batch-size "${ZOO_BATCH:-32}" --lr "${ZOO_LR:-3e-3}" --jobs "${ZOO_JOBS:-12}" --device cuda \
        --work /tmp/zoo-runs --zoo-dir /tmp/zoo 2>&1 | tee "$OUT/zoo.log"
    tar czf - -C /tmp/zoo . | split -b 15M - "$OUT/zoo.tgz.part-"
fi
ls -la "$OUT" "$OUT/bench"
