"""The real upstream CosyVoice code and a random-weight model for tests.

Upstream's unmodified source is an archive at ../shared/upstream (next to the
repository, in CI too; nothing here can reach GitHub): it is unpacked once per data
folder, or `COSYVOICE_SRC` names an unpacked copy. The tiny model is built from
upstream's own classes by the same code as `manage.py cosyvoice2_dummy_model`, once
per version of the builder. Where the archive or upstream's Python dependencies
(the `cosyvoice` extra) are missing the tests skip, except under
`CHORUS_REQUIRE_UPSTREAM=1`, which `.ci/run` sets: there they fail.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT.parent / "shared" / "upstream" / "cosyvoice-ace7c47-matcha-dd9105b.tar.gz"
ARCHIVE_SHA256 = "1a44a2e51ff640e8399c7de5c02e59e2a727d1e4cd913ade22b715fdc557f83b"
# What upstream imports that Chorus itself does not need (the `cosyvoice` extra).
_EXTRA_MODULES = ("hyperpyyaml", "conformer", "diffusers", "whisper", "onnxruntime", "lightning")
SECONDS_PER_TEXT_TOKEN = 0.8  # the tiny model's cap: 20 speech tokens at 25 per second


def _data_dir() -> Path:
    return Path(os.environ.get("CHORUS_DATA_DIR") or tempfile.gettempdir())


def _unavailable(reason: str) -> None:
    if os.environ.get("CHORUS_REQUIRE_UPSTREAM") == "1":
        pytest.fail(f"the real upstream CosyVoice tests must run here: {reason}")
    pytest.skip(reason)


@functools.cache
def _source() -> Path | str:
    """The unpacked upstream source, or why it is not available."""
    if os.environ.get("COSYVOICE_SRC"):
        return Path(os.environ["COSYVOICE_SRC"])
    if not ARCHIVE.is_file():
        return f"upstream archive not found at {ARCHIVE}"
    data = ARCHIVE.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != ARCHIVE_SHA256:
        return f"upstream archive {ARCHIVE} has sha256 {digest}, expected {ARCHIVE_SHA256}"
    target = _data_dir() / f"cosyvoice-src-{digest[:12]}"
    if not (target / "cosyvoice" / "cli" / "cosyvoice.py").is_file():
        # Unpacked beside the target and renamed: a half-unpacked tree is never used.
        staging = Path(tempfile.mkdtemp(dir=_data_dir(), prefix="cosyvoice-src-"))
        with tarfile.open(ARCHIVE) as archive:
            archive.extractall(staging, filter="data")
        staging.rename(target)
    return target


def upstream_src() -> Path:
    """The unpacked upstream source (skips or fails where it cannot run)."""
    missing = [name for name in _EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        _unavailable(
            f"upstream's dependencies are not installed ({', '.join(missing)}): "
            "pip install -e '.[cosyvoice]'"
        )
    source = _source()
    if isinstance(source, str):
        _unavailable(source)
    assert isinstance(source, Path)
    return source


@functools.cache
def _tiny_model(src: Path) -> Path:
    from synthesis.engines import cosyvoice2_dummy
    from synthesis.engines.cosyvoice2_dummy import build_dummy_model

    version = hashlib.sha256(Path(cosyvoice2_dummy.__file__).read_bytes()).hexdigest()[:12]
    folder = _data_dir() / f"cosyvoice2-tiny-{version}"
    if not (folder / "chorus-dummy.json").is_file():
        build_dummy_model(folder, size="tiny", stop="capped", src_dir=src)
    return folder


def tiny_model_dir() -> Path:
    """A tiny random CosyVoice2 folder whose LLM always decodes to upstream's cap."""
    return _tiny_model(upstream_src())


def forget_upstream_modules() -> None:
    """Drop every imported upstream module, as if this process had never loaded one."""
    for name in list(sys.modules):
        if name.split(".")[0] in ("cosyvoice", "matcha"):
            del sys.modules[name]
