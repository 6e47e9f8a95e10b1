"""scripts/training_fingerprint.py: the sink-removal recipe's first training steps fingerprinted as the trainer takes
them (the first loss is the initial model's loss on the sampler's first batch), the same on a second build and not
on another seed, comparisons that name what differs, and the nudge of one initial weight by exactly one ulp."""

import pytest
import torch
import torch.nn.functional as F

from probe.experiments.sink_emergence import build
from probe.experiments.sink_removal import RemovalConfig
from tests.support.scripts import load_script

STEPS = 2


fp = load_script("scripts/training_fingerprint.py", "training_fingerprint")


@pytest.fixture(scope="module")
def seed0():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the recipe's threads
    try:
        yield fp.fingerprint("baseline", 0, STEPS, None)
    finally:
        torch.set_num_threads(threads)


def test_the_first_loss_is_the_initial_models_on_the_samplers_first_batch(seed0):
    cfg = RemovalConfig(variants=("baseline",), seeds=(0,)).emergence()
    model = build(cfg, "baseline", 0)
    assert fp.tensors(model.state_dict()) == seed0["init"]
    batch = cfg.task.sampler(0).sample(cfg.batch_size)  # (B, T + 1)
    assert fp.sha(batch) == seed0["batches"][0]
    with torch.no_grad():
        logits = model(batch[:, :-1]).logits.float()  # (B, T, vocab)
    by_hand = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    assert len(seed0["losses"]) == len(seed0["batches"]) == STEPS
    assert seed0["losses"][0] == pytest.approx(float(by_hand), rel=1e-6)
    moved = [k for k in seed0["init"] if k != "all" and seed0["init"][k][0] != seed0["after"][k][0]]
    assert fp.NUDGED in moved  # the optimizer stepped: the attention's weights are not the initial ones


def test_a_second_build_gives_the_same_fingerprint_and_another_seed_does_not(seed0):
    again = fp.fingerprint("baseline", 0, STEPS, None)
    assert all(line.endswith(": same") for line in fp.compare(seed0, again))
    other = fp.fingerprint("baseline", 1, 1, None)
    differs = {line.split(":")[0] for line in fp.compare(seed0, other) if not line.endswith(": same")}
    assert {"init", "batches", "losses", "after"} <= differs
    assert "eval_windows" not in differs and "lr_factors" not in differs  # fixed windows, one schedule


def test_compare_names_the_tensor_that_differs(seed0):
    changed = {**seed0, "init": {**seed0["init"], fp.NUDGED: ["0" * 16, 0.0, [128, 128]]}}
    lines = fp.compare(seed0, changed)
    assert [line for line in lines if not line.endswith(": same")] == [f"init: 1 differ: {fp.NUDGED}"]


@pytest.mark.parametrize("direction", ["up", "down"])
def test_the_nudge_moves_one_weight_by_one_ulp(direction):
    cfg = RemovalConfig(variants=("baseline",), seeds=(0,)).emergence()
    model = build(cfg, "baseline", 0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fp.nudge_weight(model, direction)
    after = model.state_dict()
    assert [k for k in before if not torch.equal(before[k], after[k])] == [fp.NUDGED]
    w0, w1 = before[fp.NUDGED].view(-1), after[fp.NUDGED].view(-1)
    assert torch.equal(w0[1:], w1[1:])
    ulp = torch.finfo(torch.float32).eps * 2.0 ** torch.floor(torch.log2(w0[0].abs()))  # spacing at |w|
    assert float(w1[0] - w0[0]) == (float(ulp) if direction == "up" else -float(ulp))


def test_a_recipe_records_the_cpu_it_ran_on(monkeypatch):
    """Training is bit-exact on one machine only, so a recipe's metadata names the CPU and the kernels torch chose;
    without /proc/cpuinfo the name is what the platform module says."""
    import builtins
    import platform

    from probe.experiments.result import Timer, cpu_name

    meta = Timer().meta()
    assert meta["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert meta["cpu"] == cpu_name()

    def no_file(*_a, **_k):
        raise OSError("no /proc here")

    monkeypatch.setattr(builtins, "open", no_file)
    monkeypatch.setattr(platform, "processor", lambda: "a test CPU")
    assert cpu_name() == "a test CPU"
