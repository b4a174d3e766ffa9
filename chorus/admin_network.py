"""Admin forms whose checks reach the network, run before the admin's transaction.

Django's admin saves a POSTed form inside one transaction that opens before the
form is validated. Some of this project's forms make a network call while they
validate (a tenant's bucket is made in storage, a webhook's host is resolved).
Inside that transaction the call would hold what the transaction holds: on the
embedded default (SQLite, transactions that take the write lock when they
begin) every worker and every submit would wait for a storage server or a DNS
answer. So a POST's form is validated once before the transaction opens, which
makes those calls; the form made inside the transaction reads their outcomes
(`NetworkChecks`) instead of calling again.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from django import forms
from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.http import HttpRequest, HttpResponse

from chorus.errors import ChorusError

T = TypeVar("T")


class NetworkChecks:
    """The outcome of each network call a form's validation makes, by key: the
    first run calls, later runs (of the same request) read what it got, error
    included."""

    def __init__(self) -> None:
        self._outcomes: dict[Hashable, tuple[Any, ChorusError | None]] = {}

    def once(self, key: Hashable, call: Callable[[], T]) -> T:
        if key not in self._outcomes:
            try:
                self._outcomes[key] = (call(), None)
            except ChorusError as exc:
                self._outcomes[key] = (None, exc)
        value, error = self._outcomes[key]
        if error is not None:
            raise error
        return value  # type: ignore[no-any-return]


class NetworkCheckedForm(forms.ModelForm):
    """A form whose network calls go through `checked_once`. Outside the admin
    (a form of its own) every form calls for itself."""

    # Set on the form's class by `ChecksBeforeTransaction.get_form`.
    network_checks: NetworkChecks | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._checks = self.network_checks or NetworkChecks()

    def checked_once(self, key: Hashable, call: Callable[[], T]) -> T:
        return self._checks.once(key, call)


class ChecksBeforeTransaction(admin.ModelAdmin):
    """A model admin whose form (a `NetworkCheckedForm`) is validated once before
    the admin's transaction on every POST of the add or change page."""

    def get_form(self, request: Any, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form: Any = super().get_form(request, obj, change, **kwargs)
        # A class made for this request (`modelform_factory`): the attribute is
        # the request's alone.
        form.network_checks = getattr(request, "chorus_network_checks", None)
        return form

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if request.method == "POST":
            # Kept when the page is drawn again in the same request
            # (`chorus.admin_services`): the calls were made already.
            if not hasattr(request, "chorus_network_checks"):
                request.chorus_network_checks = NetworkChecks()  # type: ignore[attr-defined]
            obj = self.get_object(request, unquote(object_id)) if object_id else None
            # Only for a user who may save it (no bucket made for anyone else), and
            # an object that exists: otherwise Django answers as it would.
            allowed = (
                self.has_add_permission(request)
                if object_id is None
                else obj is not None and self.has_change_permission(request, obj)
            )
            if allowed:
                form = self.get_form(request, obj, change=obj is not None)
                form(request.POST, request.FILES, instance=obj).is_valid()
        return super().changeform_view(request, object_id, form_url, extra_context)
