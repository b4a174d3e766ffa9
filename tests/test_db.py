"""chorus.db: a step tried again through a database outage (`patiently`), and
connections the server ended found without a query (`chorus.db_liveness`)."""

from __future__ import annotations

import os
import resource
import time

import psycopg
import pytest
from django.db import OperationalError, connection, transaction

from chorus.db import patiently, recycle_connections
from chorus.db_liveness import connection_ended
from tenants.models import Tenant

pytestmark = pytest.mark.django_db(transaction=True)


def cut_this_connection() -> None:
    """What a database restart does to a connection: the server ends it."""
    if connection.vendor != "postgresql":
        pytest.fail("this needs PostgreSQL (make test-postgres)")
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    db = connection.settings_dict
    dsn = f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} user={db['USER']} "
    with psycopg.connect(dsn + f"dbname={db['NAME']}", autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_a_step_that_meets_a_cut_connection_is_tried_again_on_a_new_one() -> None:
    cut_this_connection()
    tries = []

    def step() -> int:
        tries.append(connection.connection)
        return Tenant.objects.count()

    assert patiently(step, patience_s=10) == 0
    assert len(tries) == 2
    assert tries[1] is None  # closed after the failure, not handed out again


def test_inside_a_callers_transaction_the_error_goes_up_at_once() -> None:
    tries = []

    def step() -> int:
        tries.append(1)
        return Tenant.objects.count()

    def in_a_transaction() -> None:
        with transaction.atomic():
            cut_this_connection()
            patiently(step, patience_s=10)

    with pytest.raises(OperationalError):
        in_a_transaction()
    assert len(tries) == 1


def test_a_database_still_away_when_patience_is_up_raises_its_error() -> None:
    def step() -> int:
        raise OperationalError("connection refused")

    with pytest.raises(OperationalError, match="refused"):
        patiently(step, patience_s=0.3)


def admin_connection() -> psycopg.Connection:  # type: ignore[type-arg]
    db = connection.settings_dict
    return psycopg.connect(
        f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} user={db['USER']} "
        f"dbname={db['NAME']}",
        autocommit=True,
    )


def until_ended(conn: psycopg.Connection) -> bool:  # type: ignore[type-arg]
    """Whether `conn` shows as ended within 2 s (the server's close travels)."""
    deadline = time.monotonic() + 2
    while not connection_ended(conn):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_connection_shows_as_ended_once_its_server_ends_it_and_not_before() -> None:
    with admin_connection() as admin, admin_connection() as conn:
        conn.execute("SELECT 1")
        assert not connection_ended(conn)
        admin.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])

        assert until_ended(conn)


def test_a_pooled_connection_the_server_ended_is_not_lent_again() -> None:
    """A restart ends every connection waiting in the pool: the next request
    gets a live one, with no health-check query before its first."""
    if connection.vendor != "postgresql":
        pytest.fail("this needs PostgreSQL (make test-postgres)")
    assert connection.pool is not None
    assert not connection.settings_dict["CONN_HEALTH_CHECKS"]
    Tenant.objects.count()
    pid = connection.connection.info.backend_pid
    connection.close()  # back to the pool, as at a request's end
    with admin_connection() as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    time.sleep(0.2)  # the server's close reaches the pooled sockets

    assert Tenant.objects.count() == 0  # no OperationalError
    assert connection.connection.info.backend_pid != pid


def test_a_worker_closes_a_kept_connection_the_server_ended() -> None:
    Tenant.objects.count()
    connection.close_at = None  # kept, as a worker keeps its connection
    raw = connection.connection
    with admin_connection() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [raw.info.backend_pid])
    assert until_ended(raw)

    recycle_connections()

    assert connection.connection is None
    assert Tenant.objects.count() == 0  # on a new one


def test_a_live_connection_on_a_descriptor_past_1023_is_not_taken_for_ended() -> None:
    """A web process holding hundreds of client connections opens its database
    connections on high descriptors (select() refuses those)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.fail(f"this needs 1200 open files; the hard limit is {hard} (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with admin_connection() as conn:
            assert conn.fileno() >= 1024
            conn.execute("SELECT 1")
            assert not connection_ended(conn)
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
