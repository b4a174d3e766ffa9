"""The process-wide storage backend, built once from settings."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from synthesis.storage import build_storage
from synthesis.storage.base import Storage


@cache
def get_storage() -> Storage:
    return build_storage(settings.STORAGE)


@receiver(setting_changed)
def _reset_on_settings_change(*, setting: str, **kwargs: Any) -> None:
    if setting in {"STORAGE", "PUBLIC_URL"}:
        get_storage.cache_clear()
