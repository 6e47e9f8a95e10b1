"""Cheap fingerprints of one sink-removal run's training, to tell whether two commits (or two machines) train the
same model without training it, and the whole run with one initial weight nudged by an fp32 ulp.

    PYTHONPATH=CHECKOUT python scripts/training_fingerprint.py [--variant baseline] [--seed 0] [--steps 4] \
        [--measure RUN_DIR] > fp.json
    python scripts/training_fingerprint.py --compare a.json b.json
    PYTHONPATH=CHECKOUT python scripts/training_fingerprint.py --train OUT [--nudge up|down]

A fingerprint is the recipe's model and data built as ``probe experiment sink-removal`` builds them
(RemovalConfig's defaults, probe.experiments.sink_emergence.build, the task's sampler and evaluation windows): the
initial state_dict (sha1 of each tensor's bytes and its sum), the first ``--steps`` training batches, the training
loss of each of those optimizer steps and the parameters after them (the real trainer, stopped by its sampler), the
optimizer's groups, the lr factor of every step, the evaluation windows, and with ``--measure`` the recipe's
measurement of RUN_DIR's last snapshot (fixed weights). The script adapts to the API of older checkouts (before
the sink-removal recipe: its settings on EmergenceConfig). ``--train`` trains and measures the whole run into OUT
with the recipe's functions, ``--nudge`` first moving one initial weight (the first of blocks.0.attn.k_proj) by one
fp32 ulp: how far an ulp-level difference (another CPU's kernel blocking) carries a run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import warnings

import torch
import torch.nn.functional as F

NUDGED = "blocks.0.attn.k_proj.weight"


def sha(t: torch.Tensor) -> str:
    return hashlib.sha1(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def tensors(state: dict) -> dict:
    """name -> [sha1, sum in fp64, shape] of each tensor, and "all": one hash over the names and their sha1s."""
    found = {k: [sha(v), float(v.double().sum()), list(v.shape)] for k, v in state.items()}
    found["all"] = hashlib.sha1(json.dumps(sorted((k, v[0]) for k, v in found.items())).encode()).hexdigest()[:16]
    return found


class StopTraining(Exception):
    pass


class RecordingSampler:
    """The recipe's sampler, keeping each batch it hands out; asked for batch ``steps + 1`` it stops the trainer."""

    def __init__(self, inner, steps: int):
        self.inner, self.steps, self.batches = inner, steps, []

    def sample(self, batch_size: int) -> torch.Tensor:
        if len(self.batches) >= self.steps:
            raise StopTraining
        batch = self.inner.sample(batch_size)  # (B, T + 1) token ids
        self.batches.append(batch.clone())
        return batch

    def __getattr__(self, name):
        return getattr(self.inner, name)


def recipe_config(variant: str, seed: int):
    try:
        from probe.experiments.sink_removal import RemovalConfig
    except ImportError:  # a checkout before the recipe: its settings on the emergence config
        from probe.experiments.sink_emergence import EmergenceConfig

        return EmergenceConfig(variants=(variant,), seeds=(seed,), steps=300, snapshot_every=100)
    cfg = RemovalConfig(variants=tuple(dict.fromkeys(("baseline", variant))), seeds=(seed,))
    return cfg.emergence() if hasattr(cfg, "emergence") else cfg


def lr_factors(tcfg) -> list[float]:
    from probe.train import schedule

    args = [tcfg.steps, min(tcfg.warmup, tcfg.steps), tcfg.schedule, tcfg.min_lr_ratio]
    if hasattr(tcfg, "warmdown"):
        args.append(tcfg.warmdown)
    return [schedule.lr_factor(step, *args) for step in range(tcfg.steps)]


def first_steps(model, task, tcfg, evals, seed: int, steps: int) -> dict:
    """The trainer's first ``steps`` optimizer steps: batches, losses, optimizer groups, parameters after them."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from probe.train import train

    sampler, losses, groups = RecordingSampler(task.sampler(seed), steps), [], []

    def loss_of(module, inputs, out):  # the training loss of each step's forward (evaluations run in eval mode)
        if module.training:
            logits = getattr(out, "logits", out).detach().float()  # (B, T, vocab)
            losses.append(float(F.cross_entropy(logits.flatten(0, 1), sampler.batches[-1][:, 1:].flatten())))

    def group_of(optimizer, *_):
        if not groups:
            groups.extend(
                {k: [list(p.shape) for p in v] if k == "params" else v for k, v in g.items()}
                for g in optimizer.param_groups
            )

    hooks = [model.register_forward_hook(loss_of), register_optimizer_step_pre_hook(group_of)]
    with tempfile.TemporaryDirectory() as out:
        try:
            train(model, sampler, tcfg, out, eval_batches=evals, progress=False)
        except StopTraining:
            pass
    for hook in hooks:
        hook.remove()
    return {
        "batches": [sha(b) for b in sampler.batches],
        "losses": losses,
        "optimizer_groups": json.loads(json.dumps(groups, default=str)),
        "after": tensors(model.state_dict()),
    }


def fingerprint(variant: str, seed: int, steps: int, measure: str | None) -> dict:
    from probe.experiments import sink_emergence

    cfg = recipe_config(variant, seed)
    model = sink_emergence.build(cfg, variant, seed)
    task, tcfg = cfg.task, cfg.train_config(seed)
    evals = task.eval_windows(cfg.n_eval_batches, cfg.eval_batch_size)
    factors = lr_factors(tcfg)
    found = {
        "settings": {k: v for k, v in vars(cfg).items() if k not in ("variants", "seeds")},
        "train_config": {k: str(v) for k, v in vars(tcfg).items()},
        "init": tensors(model.state_dict()),
        "eval_windows": sha(evals.tokens if isinstance(evals.tokens, torch.Tensor) else torch.stack(evals.tokens)),
        "lr_factors": hashlib.sha1(json.dumps(factors).encode()).hexdigest()[:16],
        **first_steps(model, task, tcfg, evals, seed, steps),
    }
    if measure:
        try:
            from probe.experiments.sink_removal import measure_run
        except ImportError:
            found["measure"] = "no sink-removal recipe at this checkout"
            return found
        row = measure_run(cfg, variant, seed, measure)["run"]
        found["measure"] = {k: row[k] for k in ("pos0_over_uniform", "r0_later", "loss", "max_activation")}
    return found


@torch.no_grad()
def nudge_weight(model, direction: str) -> None:
    """The first element of NUDGED moved to the next fp32 value up or down: one ulp, nothing else touched."""
    w = dict(model.named_parameters())[NUDGED].view(-1)
    w[0] = torch.nextafter(w[0], torch.tensor(float("inf") if direction == "up" else float("-inf")))


def train_whole(variant: str, seed: int, out: str, nudge: str | None) -> dict:
    """The whole run as the recipe trains and measures it, ``nudge`` moving one initial weight by one ulp."""
    from probe.experiments import sink_emergence
    from probe.experiments.sink_removal import measure_run

    cfg, build = recipe_config(variant, seed), sink_emergence.build

    def nudged(cfg, variant, seed):
        model = build(cfg, variant, seed)
        if nudge:
            nudge_weight(model, nudge)
        return model

    sink_emergence.build = nudged  # train_variant builds through the module's name
    sink_emergence.train_variant(cfg, variant, seed, out)
    row = measure_run(cfg, variant, seed, out)["run"]
    return {"nudge": nudge, **{k: row[k] for k in ("pos0_over_uniform", "r0_later", "loss", "max_activation")}}


def compare(a: dict, b: dict) -> list[str]:
    """One line per fingerprint entry: same, or what differs (for tensors: the names that differ)."""
    lines = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if x == y:
            lines.append(f"{key}: same")
        elif isinstance(x, dict) and isinstance(y, dict):
            names = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            lines.append(f"{key}: {len(names)} differ: {', '.join(names[:8])}")
        else:
            lines.append(f"{key}: differs: {json.dumps(x)[:200]} | {json.dumps(y)[:200]}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", default="baseline")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps to fingerprint")
    ap.add_argument("--measure", help="a finished run folder whose last snapshot the recipe measures")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two fingerprint files to compare")
    ap.add_argument("--train", metavar="OUT", help="train and measure the whole run into OUT")
    ap.add_argument("--nudge", choices=("up", "down"), help="with --train: move one initial weight by one ulp")
    a = ap.parse_args(argv)
    if a.compare:
        print("\n".join(compare(*(json.loads(open(p).read()) for p in a.compare))))
        return 0
    torch.set_num_threads(1)  # the recipe's threads
    warnings.filterwarnings("ignore")
    found = train_whole(a.variant, a.seed, a.train, a.nudge) if a.train else None
    found = found or fingerprint(a.variant, a.seed, a.steps, a.measure)
    json.dump(found, sys.stdout, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
