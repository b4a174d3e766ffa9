"""An admin list filter by tenant that does not list every tenant.

Django's default filter for a foreign key reads every tenant into the sidebar at
each page view, however many thousand there are. This one shows a search box
instead (the admin's own autocomplete, served by the Tenant admin's search over
slug and name, 20 at a time) and reads only the tenant it filters by. It keeps
Django's parameter, `tenant__id__exact`, so links made for the default filter
(the overview's, bookmarks) still work.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.contrib.admin.widgets import AutocompleteSelect
from django.db.models import Model, QuerySet
from django.forms import Media
from django.http import HttpRequest

from tenants.models import Tenant

PARAMETER = "tenant__id__exact"


def _widget(model: type[Model]) -> AutocompleteSelect:
    return AutocompleteSelect(model._meta.get_field("tenant"), admin.site)


class TenantFilter(admin.ListFilter):
    title = "tenant"
    template = "admin/tenants/tenant_filter.html"

    def __init__(
        self,
        request: HttpRequest,
        params: dict[str, Any],
        model: type[Model],
        model_admin: admin.ModelAdmin[Any],
    ) -> None:
        super().__init__(request, params, model, model_admin)
        self.model = model
        raw = params.pop(PARAMETER, None)
        value = raw[-1] if isinstance(raw, list) else raw
        self.tenant_id: int | None = int(value) if value and str(value).isdigit() else None
        if raw is not None:
            self.used_parameters[PARAMETER] = value

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str | None]:
        return [PARAMETER]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if PARAMETER in self.used_parameters:
            # A value that is not a tenant's id matches nothing (not everything).
            return queryset.filter(tenant_id=self.tenant_id or 0)
        return queryset

    def choices(self, changelist: ChangeList) -> Iterator[Any]:
        # Read by the template, which cannot pass the changelist itself.
        self.form_for_template = self.form(changelist)
        yield {
            "selected": self.tenant_id is None,
            "query_string": changelist.get_query_string(remove=[PARAMETER]),
            "display": "All",
        }

    def form(self, changelist: ChangeList) -> forms.Form:
        """The search box, with the list's other filters kept as hidden fields."""
        tenant = forms.ModelChoiceField(
            queryset=Tenant.objects.all(), widget=_widget(self.model), required=False
        )
        others = {
            key: forms.CharField(widget=forms.HiddenInput)
            for key in changelist.params
            if key not in (PARAMETER, "p")
        }
        fields = {PARAMETER: tenant, **others}
        initial = {key: changelist.params[key] for key in others}
        initial[PARAMETER] = self.tenant_id
        form_class = type("TenantFilterForm", (forms.Form,), fields)
        built: forms.Form = form_class(initial=initial, auto_id="tenant_filter_%s")
        return built


class TenantFilterMedia:
    """Mixed into a ModelAdmin whose list uses `TenantFilter`: the autocomplete's
    scripts and styles (select2, jQuery), merged with the admin's own."""

    model: type[Model]

    @property
    def media(self) -> Media:
        media: Media = super().media  # type: ignore[misc]
        return media + _widget(self.model).media
