from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants.models import Plan, Tenant
from tenants.services import api_key_create, plan_get_or_create_default, tenant_create


class Command(BaseCommand):
    help = "Create a tenant (and its bucket) and print its first API key."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--name", default="")
        parser.add_argument("--plan", default=None, help="Plan name (default: free)")

    def handle(self, *args: Any, slug: str, name: str, plan: str | None, **options: Any) -> None:
        if Tenant.objects.filter(slug=slug).exists():
            raise CommandError(f"Tenant '{slug}' already exists.")
        try:
            tenant = tenant_create(slug=slug, name=name, plan=self._plan(plan))
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        _, raw = api_key_create(tenant=tenant, name="created by create_tenant")
        self.stdout.write(raw)

    def _plan(self, name: str | None) -> Plan:
        if name is None:
            return plan_get_or_create_default()
        plan = Plan.objects.filter(name=name).first()
        if plan is None:
            names = ", ".join(Plan.objects.values_list("name", flat=True)) or "none yet"
            raise CommandError(f"No plan named '{name}' (plans: {names}).")
        return plan
