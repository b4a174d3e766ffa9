from __future__ import annotations

import hmac

from django.db import transaction
from django.utils import timezone

from synthesis.storage_runtime import get_storage
from tenants.key_cache import key_cache_forget, key_cache_get, key_cache_put
from tenants.keys import generate_key, hash_key, key_prefix, looks_like_key
from tenants.models import ApiKey, Plan, Tenant

DEFAULT_PLAN = "free"


def plan_get_or_create_default() -> Plan:
    plan, _ = Plan.objects.get_or_create(name=DEFAULT_PLAN)
    return plan


def tenant_create(*, slug: str, name: str = "", plan: Plan | None = None) -> Tenant:
    """Create a tenant and its bucket. The bucket exists before the row is visible."""
    Tenant(slug=slug, name=name or slug).clean_fields(exclude=["plan", "bucket"])
    bucket = tenant_bucket_provision(slug=slug)
    with transaction.atomic():
        return Tenant.objects.create(
            slug=slug, name=name or slug, plan=plan or plan_get_or_create_default(), bucket=bucket
        )


def tenant_bucket_provision(*, slug: str) -> str:
    """Create the tenant's bucket (idempotent) and return its name.

    Called before the tenant row is written: an orphan empty bucket is harmless
    and recreated for free, whereas a committed tenant without a bucket would
    fail its uploads.
    """
    storage = get_storage()
    bucket = storage.bucket_for(slug)
    storage.ensure_bucket(bucket)
    return bucket


def api_key_create(*, tenant: Tenant, name: str = "default") -> tuple[ApiKey, str]:
    """Returns the row and the raw key; the raw key cannot be recovered later."""
    new = generate_key()
    key = ApiKey.objects.create(tenant=tenant, name=name, prefix=new.prefix, key_hash=new.key_hash)
    return key, new.raw


def api_key_revoke(*, api_key: ApiKey) -> None:
    ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    key_cache_forget(api_key.key_hash)  # other processes forget it within the cache's time


def api_key_authenticate(*, raw: str) -> ApiKey | None:
    """The live key matching `raw`, or None. Revoked keys do not authenticate."""
    if not looks_like_key(raw):
        return None
    digest = hash_key(raw)
    key = key_cache_get(digest)
    if key is None:
        key = (
            ApiKey.objects.select_related("tenant", "tenant__plan")
            .filter(prefix=key_prefix(raw), revoked_at__isnull=True)
            .first()
        )
        if key is None or not hmac.compare_digest(key.key_hash, digest):
            return None
        key_cache_put(digest, key)
    now = timezone.now()
    # Touch at most once a minute: a write per request would serialize a tenant's calls.
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() > 60:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key
