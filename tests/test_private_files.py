"""The data folder's private files (chorus.private_files): secrets made once and
owner-only, and a folder an older version left open closed again."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from chorus.private_files import make_private, secret_file, write_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_secret_is_made_once_owner_only_and_read_the_same_after(tmp_path: Path) -> None:
    path = tmp_path / "var" / "embedded-redis.password"

    first = secret_file(path, nbytes=32)

    assert len(first) >= 32
    assert secret_file(path, nbytes=32) == first
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700


def test_an_empty_secret_file_is_refused_not_taken_for_no_password(tmp_path: Path) -> None:
    path = tmp_path / "embedded-redis.password"
    path.write_text("\n")

    with pytest.raises(ValueError, match="is empty"):
        secret_file(path, nbytes=32)


def test_a_file_written_over_a_readable_one_is_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "demo-key"
    path.write_text("old")
    path.chmod(0o644)

    write_private(path, "new\n")

    assert path.read_text() == "new\n"
    assert mode(path) == 0o600


def test_what_was_left_open_is_closed_and_links_are_not_followed(tmp_path: Path) -> None:
    data_dir = tmp_path / "var"
    (data_dir / "storage" / "chorus-alice").mkdir(parents=True)
    (data_dir / "storage" / "chorus-alice" / "job.wav").write_bytes(b"RIFF")
    (data_dir / "chorus.sqlite3").write_bytes(b"")
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("not Chorus's")
    (data_dir / "link").symlink_to(outside)
    for path in (data_dir, data_dir / "storage", data_dir / "storage" / "chorus-alice"):
        path.chmod(0o755)
    for path in (data_dir / "chorus.sqlite3", data_dir / "storage" / "chorus-alice" / "job.wav"):
        path.chmod(0o644)
    outside.chmod(0o644)

    make_private(data_dir)

    assert mode(data_dir) == 0o700
    assert mode(data_dir / "storage") == 0o700
    assert mode(data_dir / "storage" / "chorus-alice") == 0o700
    assert mode(data_dir / "chorus.sqlite3") == 0o600
    assert mode(data_dir / "storage" / "chorus-alice" / "job.wav") == 0o600
    assert mode(outside) == 0o644


def test_a_shared_folder_such_as_tmp_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "someone-elses.txt").write_text("")
    (shared / "someone-elses.txt").chmod(0o644)

    with pytest.raises(ValueError, match="shared folder"):
        make_private(shared)

    assert mode(shared) == 0o1777
    assert mode(shared / "someone-elses.txt") == 0o644
