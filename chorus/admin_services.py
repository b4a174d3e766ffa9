"""Model admins whose saves go through the services, with a service's refusal on the form.

The admin saves a valid form with `save_model`, which here calls the model's
service (`tenant_create`, `endpoint_create`, ...). A service checks again what the
form checked, and some things a form cannot (a cap counted under the tenant's
lock, against another save meanwhile). Raised in `save_model`, its refusal would
be a 500; here it undoes the admin's transaction and the page is drawn again
from the same POST, the refusal shown on the form as a validation error is.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import Model
from django.http import HttpRequest, HttpResponse

from chorus.errors import ChorusError

M = TypeVar("M", bound=Model)


class ServiceSaves(admin.ModelAdmin):
    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except (ChorusError, ValidationError) as exc:
            # Once only: the second drawing's form is invalid, so nothing is saved.
            if request.method != "POST" or hasattr(request, "chorus_refusal"):
                raise
            request.chorus_refusal = exc  # type: ignore[attr-defined]
        return super().changeform_view(request, object_id, form_url, extra_context)

    def get_form(self, request: Any, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form: Any = super().get_form(request, obj, change, **kwargs)
        refusal = getattr(request, "chorus_refusal", None)
        if refusal is None:
            return form
        messages = [refusal.message] if isinstance(refusal, ChorusError) else refusal.messages

        class Refused(form):  # type: ignore[misc,valid-type]
            def clean(self) -> Any:
                cleaned = super().clean()
                self.add_error(None, messages)
                return cleaned

        return Refused


def take_saved(obj: M, saved: M) -> None:
    """Make the admin's unsaved `obj` the row a service saved: the admin logs it,
    answers with it and saves the page's inlines against it."""
    for field in saved._meta.concrete_fields:
        setattr(obj, field.attname, getattr(saved, field.attname))
    obj._state.adding = False
    obj._state.db = saved._state.db
