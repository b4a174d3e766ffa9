"""Seed the three plans Chorus sells. Operators edit them in the admin."""

from typing import Any

from django.db import migrations

MB = 1024 * 1024
GB = 1024 * MB

PLANS: dict[str, dict[str, Any]] = {
    "free": {
        "monthly_characters": 100_000,
        "max_text_chars": 300,
        "requests_per_minute": 60,
        "max_concurrent_jobs": 4,
        "voice_slots": 5,
        "max_upload_bytes": 15 * MB,
        "max_reference_seconds": 30.0,
        "allowed_priorities": ["normal", "low"],
        "link_ttl_seconds": 3600,
        "output_retention_days": 7,
        "storage_bytes": 1 * GB,
    },
    "pro": {
        "monthly_characters": 2_000_000,
        "max_text_chars": 2_000,
        "requests_per_minute": 600,
        "max_concurrent_jobs": 16,
        "voice_slots": 50,
        "max_upload_bytes": 15 * MB,
        "max_reference_seconds": 30.0,
        "allowed_priorities": ["high", "normal", "low"],
        "link_ttl_seconds": 6 * 3600,
        "output_retention_days": 30,
        "storage_bytes": 20 * GB,
    },
    "enterprise": {
        "monthly_characters": 50_000_000,
        "max_text_chars": 5_000,
        "requests_per_minute": 3_000,
        "max_concurrent_jobs": 64,
        "voice_slots": 500,
        "max_upload_bytes": 15 * MB,
        "max_reference_seconds": 30.0,
        "allowed_priorities": ["high", "normal", "low"],
        "link_ttl_seconds": 24 * 3600,
        "output_retention_days": 90,
        "storage_bytes": 500 * GB,
    },
}


def seed(apps: Any, schema_editor: Any) -> None:
    Plan = apps.get_model("tenants", "Plan")
    for name, limits in PLANS.items():
        Plan.objects.update_or_create(name=name, defaults=limits)


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
