"""The Celery app; its configuration is the CELERY_* block of `chorus.settings`."""

from __future__ import annotations

import os

from celery import Celery

# Every worker, GPU or light, serves its host's metrics on CHORUS_METRICS_PORT
# (its `worker_init` receiver): a GPU host runs no web process to serve them.
from chorus import metrics_server  # noqa: F401

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")

app = Celery("chorus")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["synthesis", "batches", "webhooks"])
# A worker takes from each priority only what it can start at once (the broker's
# `queue_order_strategy`, `synthesis.lanes`); this step says so at start (named,
# not imported: the web tier never loads worker code).
app.steps["consumer"].add("synthesis.lanes:PriorityLanes")
# Celery's Django fixup closes the database connection around every task: a fresh
# connection (~3 ms) before each job's first query. Workers keep theirs and close
# it only when old or broken (`synthesis.worker`); the fixup recycles it this rarely.
app.conf["CELERY_DB_REUSE_MAX"] = 10_000
