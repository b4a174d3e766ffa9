from __future__ import annotations

import uuid

from django.db import models

from tenants.models import ApiKey, Tenant


class Voice(models.Model):
    """A tenant's reference recording; `version` changes whenever the audio does."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="voices")
    name = models.CharField(max_length=100)
    transcript = models.TextField(blank=True, default="")
    language = models.CharField(max_length=16, blank=True, default="")
    version = models.PositiveIntegerField(default=1)
    audio_key = models.CharField(max_length=255)
    audio_format = models.CharField(max_length=16)
    sample_rate = models.PositiveIntegerField()
    channels = models.PositiveSmallIntegerField()
    duration_s = models.FloatField()
    size_bytes = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.tenant.slug})"


class Priority(models.TextChoices):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class JobStatus(models.TextChoices):
    PENDING = "pending"  # admitted, held back so no tenant floods the broker
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


IN_FLIGHT = (JobStatus.PENDING, JobStatus.QUEUED, JobStatus.RUNNING)
WAITING = (JobStatus.PENDING, JobStatus.QUEUED)
FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class AudioFormat(models.TextChoices):
    WAV = "wav"
    FLAC = "flac"
    MP3 = "mp3"
    OPUS = "opus"
    PCM = "pcm", "pcm (raw s16le)"


class PromptSource(models.TextChoices):
    NONE = "", "no voice"
    MEMORY = "memory"
    STORAGE = "storage"
    COMPUTED = "computed"


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="jobs")
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True)
    # SET_NULL keeps the job's history when its voice is deleted; `voice_name`
    # remembers that one was asked for, so a queued job can fail with a reason.
    voice = models.ForeignKey(Voice, on_delete=models.SET_NULL, null=True, blank=True)
    voice_name = models.CharField(max_length=100, blank=True, default="")
    text = models.TextField()
    characters = models.PositiveIntegerField()
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.NORMAL)
    format = models.CharField(max_length=8, choices=AudioFormat.choices, default=AudioFormat.WAV)
    speed = models.FloatField(default=1.0)
    requested_sample_rate = models.PositiveIntegerField(
        null=True, blank=True, help_text="Asked for; empty means the engine's own rate."
    )
    stream = models.BooleanField(
        default=False, help_text="The worker publishes chunks for a live client."
    )
    instruction = models.CharField(
        max_length=500, blank=True, default="", help_text="Style or dialect (instruct mode)."
    )
    prompt_source = models.CharField(
        max_length=8, choices=PromptSource.choices, blank=True, default=""
    )
    prompt_seconds = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=12, choices=JobStatus.choices, default=JobStatus.QUEUED)
    attempts = models.PositiveIntegerField(default=0)
    # Bumped at every publish; a task carries the epoch it was sent with, so a
    # message left behind by an earlier publish (aging, retry) is ignored.
    epoch = models.PositiveIntegerField(default=0)
    published_at = models.DateTimeField(null=True, blank=True)
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    engine = models.CharField(max_length=32, blank=True, default="")
    worker = models.CharField(max_length=200, blank=True, default="")
    output_key = models.CharField(max_length=255, blank=True, default="")
    output_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    output_deleted_at = models.DateTimeField(
        null=True, blank=True, help_text="When the retention sweeper deleted the audio."
    )
    # C2PA Content Credentials of the stored audio: "embedded" in the file,
    # "sidecar" in `<output_key>.c2pa`, or "" (none: older rows, or a tenant the
    # operator lets go without). A database default for older processes' rows.
    provenance = models.CharField(max_length=8, blank=True, default="", db_default="")
    sample_rate = models.PositiveIntegerField(null=True, blank=True)
    duration_s = models.FloatField(null=True, blank=True)
    reuse_key = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="SHA-256 of what was asked (tenant, engine, voice version, text, settings).",
    )
    reused_from = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The job whose audio was copied to answer this one.",
    )
    # Long-form: the parent holds the whole text, the reservation and the joined
    # file; each segment is a child job of its own, run like any job but never
    # listed or charged (`synthesis.longform`).
    parent = models.ForeignKey(
        "self", on_delete=models.CASCADE, null=True, blank=True, related_name="segments"
    )
    segment_index = models.PositiveIntegerField(null=True, blank=True)
    segments_total = models.PositiveIntegerField(
        null=True, blank=True, help_text="Set on a long-form job: how many segments it has."
    )
    language = models.CharField(
        max_length=16, blank=True, default="", help_text="Of the text, for sentence splitting."
    )
    # Set when the job is made for a batch's item (its `batches.BatchItem` says
    # which): the plan's jobs at once leave batch items out, and this lets that
    # count read single jobs only, off `job_single_in_flight`, however many
    # items a batch has waiting. A default in the database too: rows written
    # by code that does not know the column (a deploy's older processes).
    in_batch = models.BooleanField(default=False, db_default=False, editable=False)
    # A realtime session (`synthesis.realtime`): its text arrives while it runs,
    # over the session's input stream; `text` and `characters` are what was sent.
    realtime = models.BooleanField(default=False, db_default=False, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    first_audio_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # A tenant's list, newest first, and its cursor (created_at, id).
            models.Index(fields=["tenant", "-created_at", "-id"], name="job_tenant_newest"),
            # The admin's list of every tenant's jobs, newest first.
            models.Index(fields=["-created_at", "-id"], name="job_newest"),
            models.Index(fields=["status", "priority", "created_at"]),
            models.Index(fields=["tenant", "status", "priority"]),
            # A tenant's single jobs in flight (the plan's jobs at once, read at
            # every submit): not a batch's items, not a long text's segments.
            models.Index(
                fields=["tenant"],
                condition=models.Q(
                    status__in=["pending", "queued", "running"],
                    parent__isnull=True,
                    in_batch=False,
                ),
                name="job_single_in_flight",
            ),
            # The waiting line (few rows, however long the history): places in line,
            # the release pass, admission.
            models.Index(
                fields=["priority", "tenant", "status", "created_at"],
                condition=models.Q(status__in=["pending", "queued"]),
                name="job_waiting",
            ),
            # Audio still in the bucket: a tenant's storage recount reads only these,
            # and expiry the oldest of them.
            models.Index(
                fields=["tenant", "finished_at"],
                condition=models.Q(status="succeeded", output_deleted_at__isnull=True),
                name="job_output_retained",
            ),
            models.Index(
                fields=["finished_at"],
                condition=models.Q(status="succeeded", output_deleted_at__isnull=True),
                name="job_output_expiry",
            ),
            # The latest successes, for the service time behind a waiting job's
            # estimated start (read at every poll).
            models.Index(
                fields=["-finished_at"],
                condition=models.Q(status="succeeded"),
                name="job_recent_success",
            ),
            # Jobs finished lately: the sweeper's check for unsettled reservations.
            models.Index(fields=["finished_at"], name="job_finished_at"),
            # Result reuse: a tenant's kept audio by what was asked, latest first.
            models.Index(
                fields=["tenant", "reuse_key", "-finished_at"],
                condition=models.Q(status="succeeded", output_deleted_at__isnull=True)
                & ~models.Q(reuse_key=""),
                name="job_reuse",
            ),
            # Rows row retention may prune, oldest first: finished, audio gone
            # (`synthesis.services.retention.PRUNABLE`).
            models.Index(
                fields=["finished_at"],
                condition=models.Q(status__in=["failed", "cancelled"])
                | models.Q(status="succeeded", output_deleted_at__isnull=False),
                name="job_prunable",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.id} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED

    @property
    def is_segment(self) -> bool:
        """A part of a long-form job: internal, fires no speech events of its own."""
        return self.parent_id is not None

    @property
    def is_longform(self) -> bool:
        return self.segments_total is not None


class WorkerHeartbeat(models.Model):
    """What each worker process last reported; the admin shows it."""

    name = models.CharField(max_length=200, primary_key=True)
    engine = models.CharField(max_length=32)
    device = models.CharField(max_length=64)
    memory_bytes = models.PositiveBigIntegerField(default=0)
    rss_bytes = models.PositiveBigIntegerField(
        default=0, help_text="The worker process's resident memory."
    )
    node = models.CharField(
        max_length=200, blank=True, default="", help_text="Celery's node name, e.g. gpu0@host."
    )
    queues = models.CharField(
        max_length=200, blank=True, default="", help_text="The queues it takes, in its order."
    )
    slots = models.PositiveIntegerField(
        default=1, help_text="Streams it runs at once (the `high` limit)."
    )
    streams_normal = models.PositiveIntegerField(
        default=1, help_text="Streams below which it starts a `normal` job."
    )
    streams_low = models.PositiveIntegerField(
        default=1, help_text="Streams below which it starts a `low` job."
    )
    slots_busy = models.PositiveIntegerField(default=0)
    jobs_done = models.PositiveBigIntegerField(default=0)
    jobs_failed = models.PositiveBigIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    started_at = models.DateTimeField()
    seen_at = models.DateTimeField()
    draining_since = models.DateTimeField(
        null=True, blank=True, help_text="Stopping (SIGTERM): it takes no new jobs."
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class IdempotencyKey(models.Model):
    """`Idempotency-Key` of a submission: the same key and body give the same job."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the request body.")
    job = models.ForeignKey(Job, on_delete=models.CASCADE)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="one_job_per_idempotency_key")
        ]

    def __str__(self) -> str:
        return self.key


class ConsentMethod(models.TextChoices):
    RECORDED_STATEMENT = "recorded_statement"  # the speaker says so in a recording
    SIGNED_FORM = "signed_form"
    TERMS_OF_SERVICE = "terms_of_service"  # accepted the tenant's own terms
    SELF = "self"  # the speaker is the account holder


class VoiceConsent(models.Model):
    """The speaker's consent to a voice, kept after the voice is deleted.

    The voice's own name and creation time are copied here, so a deleted voice
    leaves this record (its tombstone: `voice` empty, `voice_deleted_at` set),
    and not its audio. Consent evidence lives apart from the voice's objects
    (`consent/<voice id>/...`) and is kept with it."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="voice_consents")
    voice = models.OneToOneField(
        Voice, on_delete=models.SET_NULL, null=True, blank=True, related_name="consent"
    )
    voice_uuid = models.UUIDField(unique=True, help_text="The voice's id, kept once it is deleted.")
    voice_name = models.CharField(max_length=100)
    voice_created_at = models.DateTimeField()
    voice_deleted_at = models.DateTimeField(null=True, blank=True)
    speaker_name = models.CharField(max_length=200)
    method = models.CharField(max_length=32, choices=ConsentMethod.choices)
    given_at = models.DateTimeField(help_text="When the speaker gave consent.")
    evidence_key = models.CharField(
        max_length=255, blank=True, default="", help_text="Recording in the tenant's bucket."
    )
    evidence_size_bytes = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.speaker_name} for {self.voice_name} ({self.method})"
