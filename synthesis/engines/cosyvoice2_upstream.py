"""Importing the upstream CosyVoice runtime, and keeping tenants' text out of its logs.

Upstream is not pip-installable: a deployment clones it (with Matcha-TTS under
`third_party/`) and names the clone in `src_dir`. Three things about importing it:

- `sys.modules` keeps the first `cosyvoice` imported: a process that imported
  another copy (another clone, or the test stand-in) would silently keep using it.
  A copy from outside `src_dir` is dropped and the one in `src_dir` imported.
- `cosyvoice.utils.file_utils` calls `logging.basicConfig(level=DEBUG)` at import:
  where the root logger had no handler yet, every library's DEBUG records would
  reach stderr from then on. The root logger's handlers and level are restored (and
  Python's own WARNING fallback installed where root has none, because upstream's
  module-level `logging.info` calls would run basicConfig themselves).
- Upstream logs each text segment at INFO (and a warning quoting the text) through
  the root logger, and draws tqdm bars on stderr, so tenants' text would land in
  worker logs. A filter on the root logger drops upstream's records below WARNING
  and withholds the text of its warnings; the bars are switched off.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from pathlib import Path
from typing import Any

_PACKAGES = ("cosyvoice", "matcha")
_TEXT_WARNING = "synthesis text"


def import_cosyvoice2(src_dir: Path | None) -> Any:
    """The upstream `CosyVoice2` class, from `src_dir` when given (ImportError if absent)."""
    if src_dir is not None:
        # Front of the path (moved there if already on it), so the clone wins over
        # anything else named `cosyvoice` or `matcha`.
        for path in (src_dir / "third_party" / "Matcha-TTS", src_dir):
            if path.is_dir():
                while str(path) in sys.path:
                    sys.path.remove(str(path))
                sys.path.insert(0, str(path))
        _forget_other_copies(src_dir)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        module = importlib.import_module("cosyvoice.cli.cosyvoice")
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
        if not root.handlers and logging.lastResort is not None:
            # Upstream's module-level `logging.info(...)` calls would run basicConfig
            # the first time (a stderr handler for every level): with Python's own
            # fallback installed, root prints what it printed before, WARNING and up.
            root.addHandler(logging.lastResort)
    _quiet(module)
    return module.CosyVoice2


def _forget_other_copies(src_dir: Path) -> None:
    inside = src_dir.resolve()
    ours = [name for name in sys.modules if name.split(".")[0] in _PACKAGES]
    # A None entry means "known absent" (and is how tests simulate that): kept.
    loaded = [name for name in ours if sys.modules[name] is not None]
    if all(_is_inside(sys.modules[name], inside) for name in loaded):
        return
    for name in loaded:
        del sys.modules[name]
    importlib.invalidate_caches()


def _is_inside(module: Any, folder: Path) -> bool:
    # Upstream has namespace packages (no __init__.py): those have a path, no file.
    places = [getattr(module, "__file__", None), *getattr(module, "__path__", [])]
    found = [Path(place).resolve() for place in places if place]
    return bool(found) and all(place.is_relative_to(folder) for place in found)


def _quiet(module: Any) -> None:
    tqdm = getattr(module, "tqdm", None)
    if tqdm is not None and not isinstance(tqdm, functools.partial):
        module.tqdm = functools.partial(tqdm, disable=True)
    root = logging.getLogger()
    package = str(Path(module.__file__).resolve().parents[1])
    if not any(getattr(f, "package", None) == package for f in root.filters):
        root.addFilter(UpstreamLogFilter(package))


class UpstreamLogFilter(logging.Filter):
    """On the root logger: upstream's records below WARNING go; text in warnings is withheld.

    A logger's filters see only the records logged to it directly, so this touches
    upstream's `logging.info(...)` calls and nothing another library logs.
    """

    def __init__(self, package: str) -> None:
        super().__init__()
        self.package = package

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.pathname.startswith(self.package):
            return True
        if record.levelno < logging.WARNING:
            return False
        if _TEXT_WARNING in str(record.msg):
            record.msg, record.args = "cosyvoice: a text segment is short for its prompt", None
        return True
