"""chorus.db.patiently: a step tried again through a database outage."""

from __future__ import annotations

import psycopg
import pytest
from django.db import OperationalError, connection, transaction

from chorus.db import patiently
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
