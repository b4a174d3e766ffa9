from __future__ import annotations

from typing import Any


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    """The response is an error in the envelope, with this status and stable code."""
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"]
    return error
