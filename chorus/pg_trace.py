"""The queries a PostgreSQL connection sends, as libpq traces the protocol.

Django's query log is not the wire: it shows a BEGIN and a COMMIT for every
atomic block, whether or not psycopg sent them (`chorus.statements` sends BEGIN
in the string of the transaction's first statements, and a COMMIT at the end of
its last), and it never shows what psycopg sends of its own. Counting round trips
(a test's, a benchmark's) needs the frontend's own Query messages.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Iterator

from django.db import connection
from psycopg import pq

# One Query message in libpq's trace (timestamps suppressed); its text may span
# lines and runs to the next message.
_QUERY = re.compile(r'^F\t\d+\tQuery\t "(.*?)"\n(?=[FB]\t)', re.MULTILINE | re.DOTALL)


@contextlib.contextmanager
def queries_sent() -> Iterator[list[str]]:
    """The text of every simple-protocol query this thread's database connection
    (PostgreSQL) sends inside the block, one entry per round trip; filled in
    when the block ends."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    sent: list[str] = []
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield sent
        finally:
            pgconn.untrace()
            trace.seek(0)
            sent += _QUERY.findall(trace.read().decode())
