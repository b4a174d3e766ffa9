"""Base serializers of the native API.

`StrictInput`: input serializers refuse fields they do not declare. DRF drops
unknown keys, so `{"fromat": "mp3"}` would quietly give the default format. The
native routes answer 400 `unknown_field` instead. The OpenAI-compatible route
does not use this: OpenAI's clients send fields Chorus has no use for, and
ignoring them is that API's contract.

`ChoicesNamed`: a value outside a choice field's choices is answered with the
choices, in the message and in `details.allowed` (DRF says only "not a valid
choice"), on the native routes and the OpenAI-compatible one alike.

Both build their fields once per class (`FieldsBuiltOnce`). DRF's ModelSerializer
introspects the model (its fields, relations and unique constraints) again for
every serializer it makes: a seventh of a submit's CPU went to building the 202
answer's fields; and every serializer deep-copies its declared fields: a tenth
(py-spy, `bench/admission.py`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from rest_framework import serializers

from chorus.errors import InvalidChoice, UnknownField


class FieldsBuiltOnce(serializers.Serializer):
    """A serializer whose fields are built once per class (DRF builds them for
    every serializer: it deep-copies the declared fields, and a ModelSerializer
    introspects its model again); each serializer gets fields of its own made
    from those (`_fresh`), as a field is bound to its serializer."""

    _built: ClassVar[dict[type, dict[str, serializers.Field]]] = {}

    def get_fields(self) -> dict[str, serializers.Field]:
        built = FieldsBuiltOnce._built.get(type(self))
        if built is None:
            built = FieldsBuiltOnce._built[type(self)] = super().get_fields()
        return {name: _fresh(field) for name, field in built.items()}


class ChoicesNamed(serializers.Serializer):
    """Refuses a value outside a choice field's choices with `InvalidChoice`
    (400 invalid_request, as any invalid field), naming the choices."""

    def to_internal_value(self, data: Any) -> Any:
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError as exc:
            raise _choices_named(exc, self.fields, data) or exc from None


def _choices_named(
    exc: serializers.ValidationError, fields: Mapping[str, serializers.Field], data: Any
) -> InvalidChoice | None:
    if not isinstance(exc.detail, Mapping) or not isinstance(data, Mapping):
        return None
    errors: dict[str, Any] = dict(exc.detail)
    named: list[tuple[str, list[Any]]] = []
    for name, problems in exc.detail.items():
        field = fields.get(name)
        if not isinstance(field, serializers.ChoiceField) or not isinstance(problems, list):
            continue
        if any(getattr(problem, "code", "") == "invalid_choice" for problem in problems):
            allowed = list(field.choices)
            errors[name] = [_refusal(name, data.get(name), allowed)]
            named.append((name, allowed))
    if not named:
        return None
    name, allowed = named[0]
    return InvalidChoice(
        errors[name][0], details={"field": name, "allowed": allowed, "fields": errors}
    )


def _refusal(name: str, given: Any, allowed: list[Any]) -> str:
    return (
        f"{name} {json.dumps(given)} is not a valid choice; "
        f"use one of: {', '.join(map(str, allowed))}."
    )


class StrictInput(ChoicesNamed, FieldsBuiltOnce):
    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):  # anything else is refused by DRF as not an object
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise UnknownField(
                    f"Unknown field{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}. "
                    f"This endpoint takes: {', '.join(self.fields)}.",
                    details={"fields": unknown},
                )
        return super().to_internal_value(data)


class ModelOutput(FieldsBuiltOnce, serializers.ModelSerializer):
    """Output serializers of models."""


# Fields that hold another field or serializer, bound to them: copied deep.
_HOLDERS = (serializers.BaseSerializer, serializers.ListField, serializers.DictField)


def _fresh(field: serializers.Field) -> serializers.Field:
    """A new, unbound field like `field`, an unbound template. A plain field is
    copied shallow: binding sets attributes of the copy's own (its name, parent,
    label and source), and what it shares with the template (its arguments, its
    validators, its choices) is only read. DRF re-runs `__init__` on deep copies
    of the arguments instead (two thirds of the 202 answer's CPU). A field that
    holds another (a nested serializer, a list's or dict's `child`) is deep-copied
    as DRF does, so the inner one is bound to this copy alone."""
    if isinstance(field, _HOLDERS) or hasattr(field, "child_relation"):
        return copy.deepcopy(field)
    return copy.copy(field)
