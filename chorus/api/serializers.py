"""Input serializers of the native API refuse fields they do not declare.

DRF drops unknown keys, so `{"fromat": "mp3"}` would quietly give the default
format. The native routes answer 400 `unknown_field` instead. The
OpenAI-compatible route does not use this: OpenAI's clients send fields
Chorus has no use for, and ignoring them is that API's contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

from chorus.errors import UnknownField


class StrictInput(serializers.Serializer):
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
