from __future__ import annotations

from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, refusing as a parse error what no field could store:
    absurdly deep nesting, and strings holding a lone UTF-16 surrogate (JSON's
    `"\\ud800"` escape decodes to one; it is not text, and the database driver
    fails to encode it, which would be a 500 wherever the string is saved)."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON nested too deeply.") from None
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
