"""The demo tenant that `make run` creates, and the copy-paste example it prints."""

from __future__ import annotations

from tenants.models import Tenant
from tenants.services import api_key_create, tenant_create

DEMO_SLUG = "demo"


def demo_tenant_key() -> str:
    """A fresh key for the demo tenant (created on first use)."""
    tenant = Tenant.objects.filter(slug=DEMO_SLUG).first() or tenant_create(
        slug=DEMO_SLUG, name="Demo tenant"
    )
    _, raw = api_key_create(tenant=tenant, name="printed by make run")
    return raw


def curl_example(*, base_url: str, key: str) -> str:
    """A shell snippet: submit, poll until done, download the WAV."""
    auth = '-H "Authorization: Bearer $CHORUS_KEY"'
    field = "python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]] or \"\")'"
    return f"""\
export CHORUS_KEY={key}
SUBMITTED=$(curl -s {base_url}/v1/speech {auth} -H 'Content-Type: application/json' \\
  -d '{{"text": "Hello from Chorus. This sentence was queued, synthesized and stored."}}')
echo "$SUBMITTED"
JOB=$(echo "$SUBMITTED" | {field} id)
while STATUS=$(curl -s {base_url}/v1/speech/$JOB {auth} | {field} status); \\
  [ "$STATUS" = queued ] || [ "$STATUS" = running ]; do sleep 0.5; done
echo "job $JOB: $STATUS"
curl -s -o hello.wav "$(curl -s {base_url}/v1/speech/$JOB {auth} | {field} audio_url)" \\
  && echo "saved hello.wav (play it with: aplay hello.wav)"
"""
