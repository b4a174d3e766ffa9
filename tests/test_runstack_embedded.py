"""What `make run` starts on the embedded defaults (no DATABASE_URL, no REDIS_URL:
SQLite, the embedded Valkey, local storage), as another user of the host sees it:
the broker wants a password, the data folder is its owner's alone, and the
password outlives a restart."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import redis

from chorus.warm_up import workers_answering
from tenants.demo import curl_example
from tests.e2e.asgi import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]


def embedded_env(data_dir: Path) -> dict[str, str]:
    """This process's environment less everything that points elsewhere."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("CHORUS_", "DATABASE_URL", "REDIS_URL", "PROMETHEUS_"))
    }
    env.update(
        {
            "CHORUS_DATA_DIR": str(data_dir),
            "CHORUS_ENGINE": "synthetic",
            "CHORUS_ENGINE_OPTIONS": '{"first_chunk_delay_s": 0, "rtf": 0.01}',
            "CHORUS_FAST_PASSWORD_HASHER": "true",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


class Stack:
    """`manage.py runstack --demo` in the background, its output kept."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "runstack", "--demo", "--port", str(self.port)],
            cwd=ROOT,
            env=embedded_env(data_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._collect, daemon=True).start()
        try:
            deadline = time.monotonic() + 120
            while "saved hello.wav" not in self.printed:  # the snippet's last line
                assert self.process.poll() is None, self.printed
                assert time.monotonic() < deadline, self.printed
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        [self.demo_key] = re.findall(r"export CHORUS_KEY=(\S+)", self.printed)

    def _collect(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def printed(self) -> str:
        return "".join(self.lines)

    def speak(self, text: str) -> httpx.Response:
        """Submit `text`, wait for the job to succeed, download its audio."""
        auth = {"Authorization": f"Bearer {self.demo_key}"}
        with httpx.Client(base_url=self.url, headers=auth, timeout=30) as http:
            submitted = http.post("/v1/speech", json={"text": text})
            assert submitted.status_code == 202, submitted.text
            deadline = time.monotonic() + 60
            while (job := http.get(f"/v1/speech/{submitted.json()['id']}").json())["status"] in {
                "pending",
                "queued",
                "running",
            }:
                assert time.monotonic() < deadline, (job, self.printed)
                time.sleep(0.2)
            assert job["status"] == "succeeded", (job, self.printed)
            return httpx.get(job["audio_url"], timeout=10)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder as `make run` leaves it before the stack starts: migrated.
    Tests start on copies of it (a migration takes seconds)."""
    data_dir = tmp_path_factory.mktemp("migrated") / "var"
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=embedded_env(data_dir),
        check=True,
        capture_output=True,
        timeout=300,
    )
    return data_dir


def copy_of(migrated: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(migrated, tmp_path / "var", symlinks=True))


@pytest.fixture(scope="module")
def stack(migrated: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack for the tests that need no restart, on a data folder left open
    as `manage.py migrate` under a usual umask, or an older version, left it."""
    data_dir = copy_of(migrated, tmp_path_factory.mktemp("stack"))
    data_dir.chmod(0o755)
    (data_dir / "chorus.sqlite3").chmod(0o644)
    (data_dir / "static").chmod(0o755)
    stack = Stack(data_dir)
    yield stack
    stack.stop()


def broker_address(data_dir: Path) -> tuple[str, int, str]:
    """Host, port and password of the embedded Valkey, from the URL it left behind."""
    parts = urlsplit((data_dir / "embedded-redis.url").read_text().strip())
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port, parts.password or ""


def unauthenticated_ping(host: str, port: int) -> bytes:
    with socket.create_connection((host, port), timeout=5) as connection:
        connection.sendall(b"PING\r\n")
        return connection.recv(256)


def open_to_others(folder: Path) -> list[str]:
    """Entries of `folder` (itself included) that its group or others may use."""
    entries = [folder, *folder.rglob("*")]
    return [
        f"{entry.relative_to(folder.parent)} {stat.filemode(entry.lstat().st_mode)}"
        for entry in entries
        if not entry.is_symlink() and entry.lstat().st_mode & 0o077
    ]


def test_the_embedded_broker_refuses_a_client_without_its_password_while_jobs_succeed(
    stack: Stack,
) -> None:
    audio = stack.speak("Hello from the embedded default.")

    assert audio.status_code == 200
    assert audio.content[:4] == b"RIFF"
    host, port, password = broker_address(stack.data_dir)
    assert host == "127.0.0.1"
    assert unauthenticated_ping(host, port).startswith(b"-NOAUTH")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host=host, port=port, password="guessed", socket_timeout=5).ping()
    with redis.Redis(host=host, port=port, password=password, socket_timeout=5) as client:
        assert client.config_get("bind") == {"bind": "127.0.0.1"}
    assert password
    assert password not in stack.printed


def test_nothing_in_the_data_folder_is_readable_by_other_users(stack: Stack) -> None:
    assert stack.speak("Private audio.").status_code == 200

    assert open_to_others(stack.data_dir) == []
    for name in ("chorus.sqlite3", "storage", "demo-key", "embedded-redis.password"):
        assert (stack.data_dir / name).exists(), name
    assert list((stack.data_dir / "storage").rglob("*.wav"))


def test_the_broker_password_survives_a_restart_on_the_same_data_folder(
    migrated: Path, tmp_path: Path
) -> None:
    data_dir = copy_of(migrated, tmp_path)
    first = Stack(data_dir)
    try:
        assert first.speak("Before the restart.").status_code == 200
        password = (data_dir / "embedded-redis.password").read_text()
    finally:
        first.stop()

    again = Stack(data_dir)
    try:
        assert again.speak("After the restart.").status_code == 200
        assert (data_dir / "embedded-redis.password").read_text() == password
        host, port, in_url = broker_address(data_dir)
        assert in_url == password
        assert unauthenticated_ping(host, port).startswith(b"-NOAUTH")
    finally:
        again.stop()


def test_the_key_and_snippet_come_last_once_every_worker_answers_and_ctrl_c_stops_quietly(
    migrated: Path, tmp_path: Path
) -> None:
    data_dir = copy_of(migrated, tmp_path)
    stack = Stack(data_dir)
    try:
        # At once, as a reader pastes the snippet: every worker already takes jobs.
        host, port, password = broker_address(data_dir)
        broker = f"redis://:{password}@{host}:{port}/0"
        answered = {name.split("@")[0] for name in workers_answering(redis_url=broker, timeout=2)}
        printed = stack.printed
    finally:
        stack.stop(signal.SIGINT)

    assert answered == {"worker1", "light1", "webhooks1"}
    lines = printed.rstrip("\n").splitlines()
    snippet = curl_example(base_url=stack.url, key=stack.demo_key).rstrip("\n").splitlines()
    assert lines[-len(snippet) :] == snippet
    assert lines[-len(snippet) - 5 : -len(snippet)] == [
        "",
        "Demo tenant key (the same on every run):",
        f"  {stack.demo_key}",
        "",
        "Try it:",
    ]
    # Celery's banners and warnings went to the log file, not between the reader and the key.
    assert "celery@" not in printed
    assert "-------------- " not in printed
    log = (data_dir / "logs" / "stack.log").read_text()
    assert "worker1@" in log
    deadline = time.monotonic() + 5  # the last lines still on their way through the pipe
    while not stack.printed.rstrip().endswith("stopped") and time.monotonic() < deadline:
        time.sleep(0.1)
    after = stack.printed[len(printed) :]
    assert stack.process.returncode in (0, 130)
    assert "Traceback" not in after
    assert after.strip().splitlines()[-1] == "stopped"
