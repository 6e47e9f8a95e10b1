"""``TrainConfig``: the settings of one training run, each field with its default and, for the fields ``probe train``
takes as flags, the flag's help text and type (``probe.options``): declared once, here.

Torch-free, so that the ``probe`` parser (which builds ``probe train``'s flags from these fields) stays light."""

from __future__ import annotations

from dataclasses import dataclass, field

from probe.options import fraction, nonneg_float, nonneg_int, option, positive_float, positive_int

SCHEDULES = ("cosine", "linear-warmdown")
OPTIMIZERS = ("adamw", "muon")


@dataclass
class TrainConfig:
    steps: int = field(default=1000, metadata=option("optimizer steps", positive_int))
    # windows per optimizer step, all ranks and micro-steps together
    batch_size: int = field(default=64, metadata=option("windows per step", positive_int))
    grad_accum: int = field(
        default=1,
        metadata=option(  # micro-steps per optimizer step (per rank)
            "micro-steps per optimizer step; --batch-size stays the whole step's windows", positive_int
        ),
    )
    # peak lr of AdamW (or of Adam's share in muon mode)
    lr: float = field(default=6e-4, metadata=option("peak learning rate", positive_float))
    # the schedule ends at lr * min_lr_ratio at the final step
    min_lr_ratio: float = field(default=0.1, metadata=option("final lr / peak lr", fraction))
    warmup: int = field(default=100, metadata=option("warmup steps", nonneg_int))
    schedule: str = field(
        default="cosine",
        metadata=option(
            "after warmup: cosine to --min-lr-ratio, or constant then a linear warmdown", choices=SCHEDULES
        ),
    )
    warmdown: float = 0.2  # fraction of steps in the linear warmdown
    betas: tuple[float, float] = (0.9, 0.95)
    # AdamW's >=2-D tensors not excluded by role; Muon's matrices in muon mode
    weight_decay: float = field(
        default=0.1,
        metadata=option("on >=2-D weights not excluded by role: sinks, gates, queries, mixing weights", nonneg_float),
    )
    eps: float = 1e-8
    # global norm; 0 = no clipping (the norm is still logged)
    grad_clip: float = field(default=1.0, metadata=option("global norm clip, 0: none", nonneg_float))
    # weight of mean(logsumexp(logits)^2); LR-AttnRes 2026 uses 1e-5
    z_loss: float = field(default=0.0, metadata=option("weight of mean(logsumexp^2)", nonneg_float))
    # Muon for hidden matrices + Adam for the rest (probe.train.optim)
    optimizer: str = field(
        default="adamw",
        metadata=option("AdamW, or Muon for hidden matrices with Adam for the rest", choices=OPTIMIZERS),
    )
    muon_lr: float = field(default=1e-3, metadata=option("Muon's peak lr with --optimizer muon", positive_float))
    muon_momentum: float = 0.95
    eval_every: int = field(default=250, metadata=option("steps between evaluations (0: at the end)", nonneg_int))
    eval_batches: int = 16  # fixed batches used by evaluations during training (0 = all); the final one uses all
    ckpt_every: int = field(default=500, metadata=option("steps between checkpoints (0: at the end)", nonneg_int))
    # > 0: also keep the model at step 0, every N steps and at the end in out_dir/snapshots/
    snapshot_every: int = field(
        default=0,
        metadata=option(
            "keep the model at step 0, every N steps and at the end in DIR/snapshots/ for `probe report --checkpoints "
            "DIR` (0: none)",
            nonneg_int,
        ),
    )
    log_every: int = 10
    # torch seed of the loop; the sampler and the model must be built from the same seed (paired runs)
    seed: int = field(default=0, metadata=option("seed of the weights, data order and loop", nonneg_int))
    device: str = field(default="auto", metadata=option("cpu, cuda, ... (auto: cuda if available)"))
    amp: str = "auto"  # "auto" = bf16 autocast on CUDA, fp32 on CPU | "bf16" | "fp32"
    # process-wide: floats below 1.2e-38 become 0 (CPU); FoX's long-range logits otherwise underflow into denormals,
    # which x86 computes tens of times slower (its attention's backward 2.4x faster with it)
    flush_denormal: bool = field(
        default=False, metadata=option("flush denormal floats to zero for the rest of the process (CPU speed)")
    )
