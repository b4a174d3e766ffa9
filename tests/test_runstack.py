"""`manage.py runstack` (what `make run` starts) and a port someone else holds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_a_taken_port_stops_it_at_once_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        env = {**os.environ, "CHORUS_DATA_DIR": str(tmp_path)}
        env.pop("REDIS_URL", None)  # it would start the embedded broker first, if it did
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "manage.py", "runstack", "--port", str(port)],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        elapsed = time.monotonic() - started

    assert result.returncode != 0
    reason = [line for line in result.stderr.splitlines() if line.strip()]
    assert reason == [
        f"CommandError: port {port} on 127.0.0.1 is already in use; stop what runs there "
        "or choose another port (make run PORT=8001)"
    ]
    assert "Chorus is up" not in result.stdout
    assert not (tmp_path / "valkey").exists()  # nothing was started
    assert elapsed < 30
