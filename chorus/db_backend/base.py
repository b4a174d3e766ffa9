"""Django's PostgreSQL backend, with the pool's check of a connection it lends
made on the socket (`chorus.db_liveness`) instead of with a query.

Django offers the pool one check, `CONN_HEALTH_CHECKS`: an empty query, a round
trip, before every request's first statement. A connection the server ended
while it waited in the pool (a restart, a failover) is found here without one,
closed and handed back (the pool throws a closed connection away), and the next
one is taken, so a restarted server still costs no request.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base

from chorus.db_liveness import connection_ended


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        conn = super().get_new_connection(conn_params)
        pool = self.pool  # type: ignore[attr-defined]  # Django 5.1+, not in the stubs
        if pool is None:
            return conn
        # Bounded: the pool holds at most max_size connections that could have
        # ended; past them it opens new ones.
        for _ in range(pool.max_size):
            if not connection_ended(conn):
                break
            conn.close()
            pool.putconn(conn)
            conn = super().get_new_connection(conn_params)
        # Django sets a pooled connection's isolation level only when the settings
        # name one; a block that changed it for itself (`chorus.snapshot`) and
        # could not set it back must not pass it on. Client-side: no round trip.
        conn.isolation_level = self.settings_dict["OPTIONS"].get("isolation_level")
        return conn
