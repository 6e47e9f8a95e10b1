"""Optional dependencies that probe falls back from: Triton (the kernels' GPU paths; without it every op runs its torch
path), kaleido (PNG copies of notebook figures; without it figures stay interactive) and gguf (reading ``.gguf``
files; without it a GGUF model is refused in one line).

An install can be importable yet broken (built for another driver or Python, half upgraded): torch itself then fails
when it imports Triton. Each dependency is probed once, by what probe and torch use of it; a broken one is disabled for
the process (``sys.modules[name] = None``: its imports raise ImportError, as when it is absent) with one warning line,
so every path takes its fallback. Standard library only, so the command line can probe before torch loads.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys

# what each dependency must do for probe (and torch) to use it: the names its users reach for
USES = {
    "triton": ("triton.language", "dtype"),  # torch._dynamo reads triton.language.dtype at import
    "kaleido": ("kaleido", "start_sync_server"),
    "gguf": ("gguf", "GGUFReader"),
}
FALLBACK = {
    "triton": "every op runs its torch path",
    "kaleido": "figures stay interactive only",
    "gguf": "a .gguf model cannot be read",
}
_status: dict[str, str] = {}


def status(name: str) -> str:
    """ "absent", "ok <version>" or "broken (<type>: <first line>)" for one of ``USES``; probed once."""
    if name not in _status:
        _status[name] = _probe(name)
    return _status[name]


def _probe(name: str) -> str:
    if sys.modules.get(name, False) is None:  # disabled earlier in this process
        return "absent"
    try:
        if importlib.util.find_spec(name) is None:
            return "absent"
    except (ImportError, ValueError):
        return "absent"
    module, attr = USES[name]
    try:
        top = importlib.import_module(name)
        getattr(importlib.import_module(module), attr)
    except Exception as e:  # noqa: BLE001 - a broken install raises anything: that is what is probed
        text = str(e).strip()
        return f"broken ({type(e).__name__}: {text.splitlines()[0][:160] if text else 'no detail'})"
    version = getattr(top, "__version__", None)
    if not isinstance(version, str):
        try:
            version = importlib.metadata.version(name)
        except Exception:  # noqa: BLE001 - no distribution metadata (a source tree on the path)
            version = ""
    return f"ok {version}".rstrip()


def disable_if_broken(name: str, note) -> bool:
    """Probe ``name``; when installed but broken, make it absent for this process and ``note`` one line. True when it
    was disabled."""
    state = status(name)
    if not state.startswith("broken"):
        return False
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]
    sys.modules[name] = None  # type: ignore[assignment]  # import name -> ImportError, as if not installed
    note(f"warning: {name} is installed but {state}; {FALLBACK[name]} (pip install --force-reinstall {name})")
    return True


__all__ = ["USES", "FALLBACK", "status", "disable_if_broken"]
