"""Files in the data folder that only its owner may read: keys, the broker's
password, the SQLite database, tenants' audio. Another user of the same host must
not read a key or a recording, nor reach the embedded broker's password.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

PRIVATE_FOLDER_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def secret_file(path: Path, *, nbytes: int) -> str:
    """The secret kept in `path`; created (owner-only) on first use, the same after."""
    if not path.exists():
        path.parent.mkdir(mode=PRIVATE_FOLDER_MODE, parents=True, exist_ok=True)
        try:  # O_EXCL: two processes starting at once end up with one secret
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
            with os.fdopen(descriptor, "w") as out:
                out.write(secrets.token_urlsafe(nbytes))
        except FileExistsError:
            pass
    secret = path.read_text().strip()
    if not secret:  # an empty password would mean no password at all
        raise ValueError(f"{path} is empty: delete it and start again")
    return secret


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, owner-only from the first byte (never a moment
    readable by others, whatever the mode of the file it replaces)."""
    path.parent.mkdir(mode=PRIVATE_FOLDER_MODE, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)


def make_private(folder: Path) -> None:
    """`folder` and everything in it readable and writable by its owner only:
    what an earlier version, `manage.py migrate` or a looser umask wrote before.

    Entries of other users and symbolic links are left alone. A shared folder
    (sticky, as /tmp) is refused: it is not Chorus's to close.
    """
    folder.mkdir(mode=PRIVATE_FOLDER_MODE, parents=True, exist_ok=True)
    if folder.stat().st_mode & stat.S_ISVTX:
        raise ValueError(f"{folder} is a shared folder (sticky, as /tmp): give Chorus its own")
    _tighten(folder)
    for root, folders, files in os.walk(folder):
        for name in (*folders, *files):
            _tighten(Path(root, name))


def _tighten(path: Path) -> None:
    try:
        status = path.lstat()
        if stat.S_ISLNK(status.st_mode) or status.st_uid != os.getuid():
            return
        if status.st_mode & 0o077:
            path.chmod(stat.S_IMODE(status.st_mode) & 0o700)
    except FileNotFoundError:  # removed meanwhile (a temporary file)
        pass
