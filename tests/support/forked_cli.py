"""The `probe` command in a fresh process that starts with its libraries already imported.

A `probe` subprocess spends most of a test's time importing torch, transformers, transformer-lens, pandas and plotly
(about 6 s each on a CI core; the tiny models' work takes about 1 s). A zygote — a Python process started once per
pytest worker that has imported those libraries and nothing of probe's — forks a child for each command. The child is
a new process as a subprocess would be: its own pid, its working directory, stdin from /dev/null, stdout and stderr
to files, ``sys.argv`` and ``sys.path[0]`` as ``python -m probe.cli`` sets them, fresh random seeds, and it runs
``probe.cli`` as ``__main__`` to its exit (threads joined, atexit handlers run, streams flushed); its exit status is
the return code (−N when a signal ended it). What differs from a cold process: those libraries were imported before
probe's own start-up rather than during it (each model verb imports them before it builds its Console anyway), and
the child ends without the interpreter's teardown of its modules (objects still alive then are not finalised: a file
left unflushed would lose its tail here, where a cold process would flush it).

A test that sets its own environment (fault injection through ``sitecustomize``, a broken Triton, a missing
library) needs a cold start and gets one: ``tests.support.cli.probe`` forks only when ``env`` is None. A test that
patches the command from inside (tests/experiments/test_kill_boundaries.py: a kill at every write boundary) starts a
zygote of its own that also imports its ``prelude`` module, whose ``install(job)`` each child calls before the command.
PROBE_TESTS_COLD=1 turns the zygote off for a whole run (every command a cold subprocess), to compare the two.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# imported by the zygote before it forks: the third-party libraries every model verb imports (not probe itself)
PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.tokenization_utils_fast",
    "transformer_lens.hook_points",
    "pandas",
    "plotly.graph_objects",
    "plotly.subplots",
    "safetensors.torch",
    "tqdm",
)

ZYGOTE = r"""
import atexit, importlib, json, os, random, runpy, sys, threading, traceback

requests, replies = os.fdopen(os.dup(0), "rb", buffering=0), os.dup(1)
devnull = os.open(os.devnull, os.O_RDWR)
os.dup2(devnull, 0)
os.dup2(devnull, 1)
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
sys.stdout.flush()  # nothing the imports printed may reach a child's stdout
os.write(replies, b"ready\n")

def child(request):
    os.chdir(request["cwd"])
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    os.close(replies)
    requests.close()
    random.seed()  # a new process draws new seeds; the zygote's copies would repeat in every child
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if request.get("prelude"):  # a module the zygote imported: it patches this child before the command runs
        importlib.import_module(request["prelude"]).install(request["job"])
    sys.argv = ["probe.cli", *request["argv"]]
    sys.path[0] = os.getcwd()  # what -m puts first
    try:
        runpy.run_module("probe.cli", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    # the interpreter's exit up to its teardown of the modules: non-daemon threads joined, atexit handlers run,
    # streams flushed; the teardown itself (1.6 s with torch imported, which a light command never imports) is not
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code & 0xFF)

while line := requests.readline():
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(request)  # never returns
    os.write(replies, f"pid {pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    os.write(replies, f"status {os.waitstatus_to_exitcode(status)}\n".encode())
"""


class Zygote:
    """One zygote process, which imports ``preload`` before it forks; ``run`` forks a `probe` command from it."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = PRELOAD):
        self.log = tempfile.NamedTemporaryFile(prefix="probe-zygote-", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE, json.dumps(preload)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
        )
        if self._reply(timeout=300) != "ready":
            raise RuntimeError(f"the probe zygote did not start: {Path(self.log.name).read_text()[-2000:]}")

    def _reply(self, timeout: float) -> str:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline().decode() if ready else None
        if line is None:
            raise TimeoutError
        if not line:
            raise RuntimeError(f"the probe zygote exited: {Path(self.log.name).read_text()[-2000:]}")
        return line.strip()

    def run(
        self, argv: list[str], cwd: str | None, timeout: float, prelude: str | None = None, job: dict | None = None
    ) -> subprocess.CompletedProcess:
        """``probe ARGV`` in a child; ``prelude``: a preloaded module whose ``install(job)`` the child calls first."""
        with tempfile.TemporaryDirectory(prefix="probe-forked-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"argv": argv, "cwd": str(cwd or os.getcwd()), "stdout": str(out), "stderr": str(err)}
            request.update(prelude=prelude, job=job)
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            pid = int(self._reply(timeout=60).removeprefix("pid "))
            try:
                status = self._reply(timeout=timeout)
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                self._reply(timeout=60)
                raise subprocess.TimeoutExpired(["probe", *argv], timeout, out.read_bytes(), err.read_bytes()) from None
            code = int(status.removeprefix("status "))
            done = subprocess.CompletedProcess(["probe", *argv], code, out.read_bytes(), err.read_bytes())
            done.pid = pid  # the child's
            return done

    def close(self) -> None:
        """The zygote exits at the end of its requests (as it does when this process ends and the pipe closes)."""
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self.log.close()
        os.unlink(self.log.name)


_zygote: list[Zygote] = []


@atexit.register
def _close() -> None:
    for zygote in _zygote:
        zygote.close()


def run_forked(argv: list[str], env: dict[str, str], cwd: str | None, timeout: float) -> subprocess.CompletedProcess:
    """``probe ARGV`` forked from this process's zygote (started at the first call, with ``env``)."""
    if not _zygote or _zygote[0].process.poll() is not None:
        _zygote[:] = [Zygote(env)]
    return _zygote[0].run(argv, cwd, timeout)


def cold() -> bool:
    return os.environ.get("PROBE_TESTS_COLD") == "1"
