"""A `probe` command's write boundaries, recorded or killed at (tests/experiments/test_kill_boundaries.py).

Imported by that test's zygote (tests/support/forked_cli.py) before it forks, with the modules whose
``from probe.writes import append_line`` bindings ``install`` must reach; each child calls ``install(job)`` before the
command runs. A boundary is every ``os.replace`` / ``os.rename`` and every ``probe.writes.append_line``. ``job``: its
``mode``, "record" (every boundary logged to ``events`` with a fingerprint of the output folder before and after it)
or "kill" (``os._exit(137)`` before or after boundary ``k``, as ``when`` says, after writing which one to ``died``),
and ``cwd``, the folder the command runs in (its output folder is ``cwd/out``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

# the command and the modules that bind append_line: imported before install sweeps their bindings
import probe.cli.main  # noqa: F401
import probe.cli.train  # noqa: F401
import probe.experiments.command  # noqa: F401
import probe.experiments.sink_removal  # noqa: F401
import probe.present.training  # noqa: F401
import probe.train.trainer  # noqa: F401
import probe.writes as writes

RANDOM = 8  # the random tail mkstemp / mkdtemp give a staged name


def normal(rel: str) -> str:
    """A path with each staged name's random tail as '*' (two runs stage the same names otherwise)."""
    return "/".join(p[:-RANDOM] + "*" if p.startswith(writes.TEMP_PREFIX) else p for p in rel.split(os.sep))


def fingerprint(root: str) -> str:
    """A hash of the folder's names (staged names normalised) and contents."""
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        h.update(b"D" + normal(os.path.relpath(folder, root)).encode())
        for name in sorted(files):
            path = os.path.join(folder, name)
            h.update(b"F" + normal(os.path.relpath(path, root)).encode())
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def checkpoint_step(root: str) -> int | None:
    """The newest complete checkpoint's step under root (checkpoint/, checkpoint.old/), or None."""
    steps = []
    for folder, _, files in os.walk(root):
        if os.path.basename(folder) in ("checkpoint", "checkpoint.old") and "trainer_state.json" in files:
            with open(os.path.join(folder, "trainer_state.json")) as f:
                steps.append(json.load(f)["step"])
    return max(steps, default=None)


def install(job: dict) -> None:
    """Patch this process's write boundaries as ``job`` says (module docstring)."""
    mode, root, count, events = job["mode"], os.path.join(job["cwd"], "out"), [0], []
    real_replace, real_rename, real_append = os.replace, os.rename, writes.append_line

    def boundary(op, dst, commit):
        count[0] += 1
        k, rel = count[0], normal(os.path.relpath(os.fspath(dst), job["cwd"]))
        if mode == "record":
            event = dict(k=k, op=op, dst=rel, existed=os.path.lexists(dst), before=fingerprint(root))
            event["ckpt_before"] = checkpoint_step(root)
            commit()
            events.append(dict(event, after=fingerprint(root), ckpt_after=checkpoint_step(root)))
            with open(job["events"], "w") as f:
                json.dump(events, f)
            return
        if k == job["k"] and job["when"] == "before":
            die(k, op, rel)
        commit()
        if k == job["k"] and job["when"] == "after":
            die(k, op, rel)

    def die(k, op, rel):
        fd = os.open(job["died"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.write(fd, json.dumps([k, op, rel]).encode())
        os._exit(137)  # kill -9: no finally, no atexit, no flush

    def replace(src, dst, *a, **kw):
        return boundary("replace", dst, lambda: real_replace(src, dst, *a, **kw))

    def rename(src, dst, *a, **kw):
        return boundary("rename", dst, lambda: real_rename(src, dst, *a, **kw))

    def append_line(path, line):
        return boundary("append", path, lambda: real_append(path, line))

    os.replace, os.rename = replace, rename
    for module in list(sys.modules.values()):  # every `from probe.writes import append_line` binding
        if getattr(module, "append_line", None) is real_append:
            module.append_line = append_line
