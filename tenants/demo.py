"""The demo tenant that `make run` creates, and the copy-paste example it prints."""

from __future__ import annotations

from pathlib import Path

from django.db import transaction
from django.utils import timezone

from chorus.private_files import write_private
from tenants.models import ApiKey, Plan, Tenant
from tenants.services import api_key_authenticate, api_key_create, tenant_create

DEMO_SLUG = "demo"
DEMO_KEY_NAME = "printed by make run"
# Someone trying Chorus on their own machine loads it from a few terminals or with
# `chorus-loadtest --concurrency 1-10`: the free plan's 4 jobs in flight and 60
# requests a minute would refuse that. The demo tenant is on `pro` (16 and 600).
DEMO_PLAN = "pro"


def demo_tenant_key(*, key_file: Path) -> str:
    """The demo tenant's key (the tenant is created on first use).

    The same key on every `make run` while it works, so a terminal that exported
    it keeps working across restarts; it is kept in `key_file` (owner-only), next
    to the embedded database it opens. A key that no longer authenticates
    (revoked in the admin, file lost) is replaced, and the demo keys printed
    before it are revoked: one live demo key, never an accumulation.
    """
    saved = _read(key_file)
    if saved and api_key_authenticate(raw=saved) is not None:
        return saved
    # Created outside the key's transaction: its bucket is provisioned first
    # (network I/O on S3), and on SQLite a transaction holds the database's lock.
    tenant = Tenant.objects.filter(slug=DEMO_SLUG).first() or tenant_create(
        slug=DEMO_SLUG, name="Demo tenant", plan=Plan.objects.filter(name=DEMO_PLAN).first()
    )
    with transaction.atomic():
        key, raw = api_key_create(tenant=tenant, name=DEMO_KEY_NAME)
        ApiKey.objects.filter(tenant=tenant, name=DEMO_KEY_NAME, revoked_at__isnull=True).exclude(
            pk=key.pk
        ).update(revoked_at=timezone.now())
    write_private(key_file, raw + "\n")
    return raw


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def curl_example(*, base_url: str, key: str) -> str:
    """A shell snippet: submit, wait for the job (through pending, queued and
    running), download the WAV. Polls are reads, under the generous read limit.

    It exports where this stack serves as CHORUS_URL, beside the key: the docs'
    examples call `$CHORUS_URL`, so one pasted later reaches this stack, not
    whatever else listens on a port written into a page."""
    auth = '-H "Authorization: Bearer $CHORUS_KEY"'
    field = "python3 -c 'import json,sys; print(json.load(sys.stdin).get(sys.argv[1]) or \"\")'"
    return f"""\
export CHORUS_URL={base_url}
export CHORUS_KEY={key}
SUBMITTED=$(curl -s $CHORUS_URL/v1/speech {auth} -H 'Content-Type: application/json' \\
  -d '{{"text": "Hello from Chorus. This sentence was queued, synthesized and stored."}}')
echo "$SUBMITTED"
JOB=$(echo "$SUBMITTED" | {field} id)
while STATUS=$(curl -s $CHORUS_URL/v1/speech/$JOB {auth} | {field} status); \\
  [ "$STATUS" = pending ] || [ "$STATUS" = queued ] || [ "$STATUS" = running ]; do sleep 1; done
echo "job $JOB: $STATUS"
curl -s -o hello.wav "$(curl -s $CHORUS_URL/v1/speech/$JOB {auth} | {field} audio_url)" \\
  && echo "saved hello.wav (play it with: aplay hello.wav)"
"""
