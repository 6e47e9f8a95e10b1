"""Training: the loop (trainer), optimizers (optim), lr schedules (schedule), checkpoints, and torchrun DDP.
The layout of a run directory (metrics, checkpoint, snapshots, final model) is ``probe.runs``."""
from .checkpoint import export_model, find_checkpoint, load_checkpoint, save_checkpoint
from .distributed import DistInfo, setup
from .optim import build_optimizer, param_groups
from .schedule import lr_factor
from .trainer import Sampler, TrainConfig, evaluate, lm_loss, read_metrics, train

__all__ = ["TrainConfig", "train", "evaluate", "lm_loss", "read_metrics", "Sampler", "build_optimizer", "param_groups",
           "lr_factor", "save_checkpoint", "load_checkpoint", "find_checkpoint", "export_model", "setup", "DistInfo"]
