"""Training: the loop (trainer), optimizers (optim), lr schedules (schedule), checkpoints, and torchrun DDP; its
settings are ``TrainConfig`` (config). The layout of a run directory (metrics, checkpoint, snapshots, final model) is
``probe.runs``.

The names below are imported from their modules on first use, so that ``probe.train.config`` (torch-free: the
``probe`` parser builds ``probe train``'s flags from it) does not import torch with the package."""

from importlib import import_module

_FROM = {
    "export_model": "checkpoint",
    "find_checkpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
    "DistInfo": "distributed",
    "setup": "distributed",
    "build_optimizer": "optim",
    "param_groups": "optim",
    "lr_factor": "schedule",
    "TrainConfig": "config",
    "Sampler": "trainer",
    "evaluate": "trainer",
    "lm_loss": "trainer",
    "read_metrics": "trainer",
    "train": "trainer",
}

__all__ = [
    "TrainConfig",
    "train",
    "evaluate",
    "lm_loss",
    "read_metrics",
    "Sampler",
    "build_optimizer",
    "param_groups",
    "lr_factor",
    "save_checkpoint",
    "load_checkpoint",
    "find_checkpoint",
    "export_model",
    "setup",
    "DistInfo",
]


def __getattr__(name: str):
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_FROM[name]}"), name)
    globals()[name] = value
    return value
