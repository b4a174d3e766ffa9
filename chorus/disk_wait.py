"""A submit's rows visible to the workers at once, and on disk before it is answered.

PostgreSQL's commit waits for its write-ahead log to reach the disk (an
fdatasync) before the transaction becomes visible to anyone else. A submit's job
is what a worker looks for the moment its message is published, so that wait was
on the way to every stream's first audio. Instead the submit's transaction
commits without it (`synchronous_commit` off for that one transaction: its rows
are visible the moment it commits), its message goes out, and only then does the
web tier wait for the disk, in a round trip of its own, before it answers. The
client hears of its job only once a crash of PostgreSQL can no longer lose it,
as before; the worker no longer waits for the disk to start.

A crash in between loses the job as if it had never been submitted: the client
gets an error (the wait's), nothing was charged (the reservation went with it),
and a worker that took its message finds no job to claim, or loses the claim
with the crash and stops at its first write (`docs/reliability.md`).
"""

from __future__ import annotations

from django.db import connection

from chorus.statements import Statement, commits_at_block_end

# Lets the transaction it runs in commit without waiting for the disk (a
# submit's here; a claim's in `synthesis.job_rows`).
UNFLUSHED = Statement("SET LOCAL synchronous_commit TO OFF")


def commit_unflushed() -> list[Statement]:
    """The statement that lets the transaction it runs in commit without waiting
    for the disk, to send with the transaction's statements; the caller then owes
    `wait_for_disk()` before it answers. Only in the transaction Django commits at
    the block's end, on PostgreSQL: [] elsewhere (an outer block's commit is its
    owner's; SQLite has no such setting)."""
    if connection.vendor != "postgresql" or not commits_at_block_end():
        return []
    return [UNFLUSHED]


def wait_for_disk() -> None:
    """Return once every transaction this connection committed is on disk.

    A transaction that writes to the log commits, by default, only once the log
    is flushed up to its commit record: the log is one sequence, so everything
    committed before, on any connection, is flushed with it. The smallest such
    write is a transactional logical decoding message (an empty one, prefix
    `chorus.disk_wait`, which a logical replication consumer asked for messages
    would see; nothing else reads it). A transaction that only takes an id
    writes its commit record but, having logged nothing else, does not wait for
    it. (Where the server or the role commits without waiting for the disk,
    `synchronous_commit = off`, this waits for nothing, as every commit there.)
    Each wait takes a transaction id: a submit now takes two, which brings the
    job table's anti-wraparound vacuum round twice as often. On SQLite, whose
    commits are on disk when they return, nothing."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(_WAIT_SQL)


_WAIT_SQL = "SELECT pg_logical_emit_message(true, 'chorus.disk_wait', '')"
