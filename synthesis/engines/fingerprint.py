"""A model folder's fingerprint, for keying a device profile (`synthesis.calibration`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

# Each file's name, size and first and last MiB: hashing all of CosyVoice2-0.5B's
# ~4 GB would take seconds at every worker start.
_EDGE = 2**20


def files_fingerprint(root: Path, names: list[str]) -> str:
    """sha256 over each named file's (or folder's files') name, size, first and
    last MiB; a missing name counts as missing."""
    digest = hashlib.sha256()
    for name in sorted(names):
        path = root / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            relative = file.relative_to(root).as_posix()
            if not file.is_file():
                digest.update(f"{relative}\0missing\0".encode())
                continue
            size = file.stat().st_size
            digest.update(f"{relative}\0{size}\0".encode())
            with file.open("rb") as handle:
                digest.update(handle.read(_EDGE))
                if size > 2 * _EDGE:
                    handle.seek(-_EDGE, 2)
                    digest.update(handle.read(_EDGE))
    return digest.hexdigest()
