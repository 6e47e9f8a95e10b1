"""Does a sink reduce mixing? Sensitivity of the last token (docs/definitions.md#sensitivity) on the Bigram-Backcopy zoo
models with and without their BOS, and representational collapse (docs/definitions.md#collapse) over lengths.

    nice python benchmarks/sensitivity_zoo.py [--batches 2] [--batch-size 8] [--ctx 64] [--threads 1]

Sensitivity: exact, every layer, on the verb's windows (``synthetic:bb``, BOS first); "no BOS" are the same windows
with the BOS dropped (position 0 is then the first text token, one more text token at the end; these models always
trained with a BOS, so those windows are out of their distribution). Collapse: the pair (a…a b, a…a a b) with a, b =
ids 10, 11, lengths 2 … 255, float32 and bfloat16.

Measured 2026-12-05 (2 x 8 windows of 64 tokens, CPU; the numbers are deterministic), last layer (1 of 0-1):

  model           BOS     first   rest_mean   last    first_share  mixing
  bb-baseline     with    25.43   6.448       143.2   0.0435       0.708
  bb-baseline     without  8.21   7.012       145.8   0.0138       0.739
  bb-sinklogit    with     5.49   5.780       128.5   0.0111       0.728
  bb-sinklogit    without  5.73   5.920       128.7   0.0115       0.729
  bb-sink+proj    with     0.21   0.364       161.3   0.0012       0.117
  bb-sink+proj    without  0.13   1.071       164.6   0.0006       0.251

  collapse, relative distance ‖y(s) − y(s')‖ / ‖y(s)‖ at n = 16 / 64 / 255:
  bb-baseline   float32 9.6e-3 / 4.7e-4 / 2.8e-5, bfloat16 1.1e-2 / 3.2e-3 / 0 (identical)
  bb-sinklogit  float32 2.1e-2 / 2.2e-3 / 2.0e-4, bfloat16 2.4e-2 / 7.1e-3 / 3.7e-3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# benchmarks/kernels.py would shadow the `kernels` package transformers imports: keep this folder off the path
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import torch  # noqa: E402

MODELS = ("probe/bb-baseline", "probe/bb-sinklogit", "probe/bb-sink+proj")
LENGTHS = (2, 4, 8, 16, 32, 64, 128, 255)
SHOWN = ("layer", "first", "rest_mean", "last", "first_share", "mixing", "decay_slope")


def main(argv=None) -> int:
    import probe
    from probe.analyses.collapse import collapse
    from probe.analyses.sensitivity import SensitivityOptions, sensitivity
    from probe.jobs.inputs import windows_for
    from probe.jobs.specs import WindowSpec

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    for name in MODELS:
        model = probe.load(name)
        eb, _ = windows_for(WindowSpec(batches=args.batches, batch_size=args.batch_size, ctx=args.ctx), model)
        for label, tokens in (("with BOS", eb.tokens), ("without BOS", eb.tokens[..., 1:])):
            summary = sensitivity(model, tokens, SensitivityOptions(layers="all"))["summary"]
            print(f"{name}, {label}:\n{summary[list(SHOWN)].to_string(index=False)}", flush=True)
        lengths = collapse(model, LENGTHS, 10, 11)["lengths"]
        print(f"{name}, collapse:\n{lengths[['length', 'dtype', 'relative', 'identical']].to_string(index=False)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
