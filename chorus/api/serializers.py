"""Base serializers of the native API.

`StrictInput`: input serializers refuse fields they do not declare. DRF drops
unknown keys, so `{"fromat": "mp3"}` would quietly give the default format. The
native routes answer 400 `unknown_field` instead. The OpenAI-compatible route
does not use this: OpenAI's clients send fields Chorus has no use for, and
ignoring them is that API's contract.

Both build their fields once per class (`FieldsBuiltOnce`). DRF's ModelSerializer
introspects the model (its fields, relations and unique constraints) again for
every serializer it makes: a seventh of a submit's CPU went to building the 202
answer's fields; and every serializer deep-copies its declared fields: a tenth
(py-spy, `bench/admission.py`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

from rest_framework import serializers

from chorus.errors import UnknownField


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


class StrictInput(FieldsBuiltOnce):
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
