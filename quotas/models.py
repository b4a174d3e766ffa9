from __future__ import annotations

from django.db import models
from django.db.models import Q

from tenants.models import Tenant


class UsagePeriod(models.Model):
    """A tenant's character account for one billing month.

    `reserved` holds characters of jobs submitted but not yet settled; `used`
    holds characters of jobs that succeeded. Admission needs
    used + reserved + new <= limit, checked under this row's lock.

    The job counters and `audio_ms` count the jobs reserved in this period as
    each is settled (see `quotas.services._settle`), so usage is read from this
    row instead of counted over the month's jobs; the sweeper checks them
    against a recount (`quotas.counters`).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="usage_periods")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    characters_used = models.PositiveBigIntegerField(default=0)
    characters_reserved = models.PositiveBigIntegerField(default=0)
    jobs_succeeded = models.PositiveIntegerField(default=0)
    jobs_failed = models.PositiveIntegerField(default=0)
    jobs_cancelled = models.PositiveIntegerField(default=0)
    audio_ms = models.PositiveBigIntegerField(default=0, help_text="Audio made by these jobs.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "starts_at"], name="one_period_per_start"),
        ]
        ordering = ["-starts_at"]

    def __str__(self) -> str:
        return f"{self.tenant.slug} {self.starts_at:%Y-%m-%d}"


class StorageUsage(models.Model):
    """Bytes a tenant keeps in its bucket: its voices plus audio not yet expired.

    Kept by the services that store and delete (voice create and delete, a job's
    success, expiry), in the transaction that makes the change, so admission and
    uploads read one row instead of summing the tenant's history. The sweeper
    recounts a few tenants per pass and corrects any drift.
    """

    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, primary_key=True, related_name="storage_usage"
    )
    bytes_used = models.BigIntegerField(default=0)
    reconciled_at = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        verbose_name_plural = "storage usage"

    def __str__(self) -> str:
        return f"{self.tenant_id}: {self.bytes_used} bytes"


class LedgerKind(models.TextChoices):
    RESERVE = "reserve"
    COMMIT = "commit"
    REFUND = "refund"


class LedgerEntry(models.Model):
    """One movement of characters for one job. The constraints make each happen
    at most once: one reservation per job, and one settlement (commit or refund)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="ledger")
    period = models.ForeignKey(UsagePeriod, on_delete=models.CASCADE, related_name="entries")
    job = models.ForeignKey("synthesis.Job", on_delete=models.CASCADE, related_name="ledger")
    kind = models.CharField(max_length=8, choices=LedgerKind.choices)
    characters = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job"], condition=Q(kind="reserve"), name="one_reservation_per_job"
            ),
            models.UniqueConstraint(
                fields=["job"],
                condition=Q(kind__in=["commit", "refund"]),
                name="one_settlement_per_job",
            ),
        ]
        indexes = [models.Index(fields=["tenant", "kind", "created_at"])]
        verbose_name_plural = "ledger entries"

    def __str__(self) -> str:
        return f"{self.kind} {self.characters} for job {self.job_id}"
