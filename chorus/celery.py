"""The Celery app; its configuration is the CELERY_* block of `chorus.settings`."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")

app = Celery("chorus")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["synthesis"])
