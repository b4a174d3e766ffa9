from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from webhooks.services.endpoints import endpoint_secrets_reseal


class Command(BaseCommand):
    help = (
        "Seal every webhook endpoint's secret under the current CHORUS_SECRET_KEY. "
        "After changing the key, run it with the former key in "
        "CHORUS_SECRET_KEY_FALLBACKS; once it reports none left, the former key "
        "can be dropped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be resealed; write nothing."
        )

    def handle(self, *args: Any, dry_run: bool, **options: Any) -> None:
        report = endpoint_secrets_reseal(dry_run=dry_run)
        verb = "would be resealed" if dry_run else "resealed"
        self.stdout.write(
            f"{report.resealed} {verb}, {report.current} already under the current key, "
            f"{len(report.broken)} that no configured key opens"
        )
        if report.broken:
            # Those endpoints' deliveries fail until their tenants rotate the secret
            # (or the key that sealed them is listed again): not a silent success.
            ids = ", ".join(str(pk) for pk in report.broken)
            raise CommandError(
                f"No configured key opens the secrets of these endpoints: {ids}. List the "
                "key that sealed them in CHORUS_SECRET_KEY_FALLBACKS, or have their "
                "tenants rotate the secret (POST /v1/webhooks/endpoints/{id}/rotate-secret)."
            )
