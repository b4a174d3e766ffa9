from __future__ import annotations

import hmac
from datetime import date
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.models import EventType
from audit.services import audit_record, changes
from synthesis.storage_runtime import get_storage
from tenants.key_cache import key_cache_forget, key_cache_get, key_cache_put
from tenants.keys import generate_key, hash_key, key_prefix, looks_like_key
from tenants.models import SCOPES, ApiKey, Plan, Tenant

DEFAULT_PLAN = "free"


def plan_get_or_create_default() -> Plan:
    plan, _ = Plan.objects.get_or_create(name=DEFAULT_PLAN)
    return plan


def tenant_create(
    *,
    slug: str,
    name: str = "",
    plan: Plan | None = None,
    active: bool = True,
    limit_overrides: dict[str, Any] | None = None,
    billing_anchor: date | None = None,
    bucket: str | None = None,
) -> Tenant:
    """Create a tenant and its bucket. The bucket exists before the row is visible.

    `bucket` is one the caller made already (`tenant_bucket_provision`): the admin
    makes it before its transaction opens (`chorus.admin_network`)."""
    tenant = Tenant(
        slug=slug,
        name=name or slug,
        active=active,
        limit_overrides=limit_overrides or {},
        billing_anchor=billing_anchor,
    )
    tenant.full_clean(exclude=["plan", "bucket"], validate_unique=False)
    tenant.bucket = bucket or tenant_bucket_provision(slug=slug)
    tenant.plan = plan or plan_get_or_create_default()
    with transaction.atomic():
        tenant.save(force_insert=True)
        audit_record(
            type=EventType.TENANT_CREATED,
            tenant_id=tenant.pk,
            target=f"tenant:{tenant.slug}",
            data={**_tenant_fields(tenant), "slug": tenant.slug},
        )
    return tenant


def tenant_update(
    *,
    tenant: Tenant,
    name: str,
    active: bool,
    plan: Plan,
    limit_overrides: dict[str, Any],
    billing_anchor: date | None,
) -> Tenant:
    """Set every field an operator may change (the slug named the bucket: never)."""
    before = _tenant_fields(Tenant.objects.select_related("plan").get(pk=tenant.pk))
    tenant.name, tenant.active, tenant.plan = name, active, plan
    tenant.limit_overrides, tenant.billing_anchor = limit_overrides, billing_anchor
    tenant.full_clean(exclude=["bucket"], validate_unique=False)
    with transaction.atomic():
        tenant.save(update_fields=["name", "active", "plan", "limit_overrides", "billing_anchor"])
        changed = changes(before, _tenant_fields(tenant))
        if changed:
            audit_record(
                type=EventType.TENANT_UPDATED,
                tenant_id=tenant.pk,
                target=f"tenant:{tenant.slug}",
                data=changed,
            )
    return tenant


def _tenant_fields(tenant: Tenant) -> dict[str, Any]:
    anchor = tenant.billing_anchor
    return {
        "name": tenant.name,
        "active": tenant.active,
        "plan": tenant.plan.name,
        "limit_overrides": tenant.limit_overrides,
        "billing_anchor": anchor.isoformat() if anchor else None,
    }


def plan_record_change(*, plan: Plan, before: Plan | None) -> None:
    """Record an operator's new or changed plan (the admin saves the row itself,
    in the transaction this joins); `before` is the row as it was stored."""
    after = _plan_fields(plan)
    if before is None:
        audit_record(
            type=EventType.PLAN_CREATED, tenant_id=None, target=f"plan:{plan.name}", data=after
        )
        return
    changed = changes(_plan_fields(before), after)
    if changed:
        audit_record(
            type=EventType.PLAN_UPDATED, tenant_id=None, target=f"plan:{plan.name}", data=changed
        )


def _plan_fields(plan: Plan) -> dict[str, Any]:
    return {f.name: f.value_from_object(plan) for f in Plan._meta.concrete_fields if f.name != "id"}


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


def api_key_create(
    *,
    tenant: Tenant,
    name: str = "default",
    scopes: list[str] | None = None,
    requests_per_minute: int | None = None,
) -> tuple[ApiKey, str]:
    """Returns the row and the raw key; the raw key cannot be recovered later.
    Every scope unless `scopes` says otherwise; the plan's rate unless
    `requests_per_minute` does."""
    new = generate_key()
    key = ApiKey(
        tenant=tenant,
        name=name,
        prefix=new.prefix,
        key_hash=new.key_hash,
        scopes=list(SCOPES) if scopes is None else scopes,
        requests_per_minute=requests_per_minute,
    )
    key.clean()
    with transaction.atomic():
        key.save(force_insert=True)
        audit_record(
            type=EventType.KEY_CREATED,
            tenant_id=tenant.pk,
            target=f"api_key:{key.prefix}",
            data=_key_fields(key),
        )
    return key, new.raw


def api_key_update(
    *, api_key: ApiKey, name: str, scopes: list[str], requests_per_minute: int | None
) -> ApiKey:
    before = _key_fields(ApiKey.objects.get(pk=api_key.pk))
    api_key.name, api_key.scopes = name, scopes
    api_key.requests_per_minute = requests_per_minute
    api_key.clean()
    with transaction.atomic():
        api_key.save(update_fields=["name", "scopes", "requests_per_minute"])
        changed = changes(before, _key_fields(api_key))
        if changed:
            audit_record(
                type=EventType.KEY_UPDATED,
                tenant_id=api_key.tenant_id,
                target=f"api_key:{api_key.prefix}",
                data=changed,
            )
    # New scopes hold at once here, elsewhere within the cache's time.
    key_cache_forget(api_key.key_hash)
    return api_key


def _key_fields(key: ApiKey) -> dict[str, Any]:
    return {
        "name": key.name,
        "scopes": list(key.scopes),
        "requests_per_minute": key.requests_per_minute,
    }


def api_key_revoke(*, api_key: ApiKey) -> None:
    with transaction.atomic():
        revoked = ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if revoked:  # not again for a key already revoked
            audit_record(
                type=EventType.KEY_REVOKED,
                tenant_id=api_key.tenant_id,
                target=f"api_key:{api_key.prefix}",
                data={"name": api_key.name},
            )
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
