from __future__ import annotations

from typing import Any

from rest_framework import parsers, renderers
from rest_framework.exceptions import ParseError
from rest_framework.utils import json


class JSONParser(parsers.BaseParser):
    """DRF's JSON parser, reading the request's stream itself, and refusing as a
    parse error what no field could store: absurdly deep nesting, and strings
    holding a lone UTF-16 surrogate (JSON's `"\\ud800"` escape decodes to one; it is
    not text, and the database driver fails to encode it, which would be a 500
    wherever the string is saved).

    Not a subclass of DRF's `JSONParser`: DRF hands its own JSON parser
    `request.body`, which holds every body to DATA_UPLOAD_MAX_MEMORY_SIZE (1 MiB)
    whatever the route, and a batch the plan allows can be far larger. This one is
    given the stream, whose length the view has held to its route's limit
    (`quotas.body_limits`)."""

    media_type = "application/json"
    renderer_class = renderers.JSONRenderer

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        # DRF's check refuses bytes-to-bytes charsets (bz2_codec would inflate the body).
        encoding = parsers.get_encoding(parser_context or {})  # type: ignore[attr-defined]
        try:
            data = json.loads(stream.read().decode(encoding))
        except RecursionError:
            raise ParseError("JSON nested too deeply.") from None
        except ValueError as exc:  # UnicodeDecodeError included
            raise ParseError(f"JSON parse error - {exc}") from None
        where = _lone_surrogate(data, "")
        if where is not None:
            raise ParseError(
                f"The JSON string at {where or 'the top level'} is not valid text: it holds "
                "an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)."
            )
        return data


def _lone_surrogate(value: Any, path: str) -> str | None:
    """The path of the first string (key or value) that is not valid Unicode text."""
    if isinstance(value, str):
        return None if _is_text(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if not _is_text(str(key)):
                return path or "the top level"
            found = _lone_surrogate(item, here)
            if found is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _lone_surrogate(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
