"""Lists, newest first, paged by a cursor on (created_at, id).

A page is read off an index from where the previous one ended, so the hundredth
page costs what the first does; an offset would have the database step over
every row before it. `limit` (default 20, at most 100) sets the page size; the
answer's `next` and `previous` are links with an opaque `cursor`. `offset` is
still understood, for clients written before cursors, and its `next` link
continues with a cursor; but it costs what it skips (7.1 s at an offset of a
quarter of a 5M-job tenant's list, `bench/growth.py`), so one past `MAX_OFFSET`
is refused (400 `offset_too_deep`) rather than have one request read millions of
index entries. No exact count of a large table: only lists bounded by the plan
(voices) give `count`.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q, QuerySet
from rest_framework.request import Request
from rest_framework.utils.urls import remove_query_param, replace_query_param

from chorus.errors import ChorusError, InvalidInput

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
# The deepest `offset` answered: a few milliseconds of index to skip.
MAX_OFFSET = 10_000


class OffsetTooDeep(ChorusError):
    status = 400
    code = "offset_too_deep"


@dataclass(frozen=True)
class _Cursor:
    created_at: datetime
    id: uuid.UUID
    older: bool  # the page after (older than) this row; else the page before it

    def encode(self) -> str:
        raw = f"{'o' if self.older else 'n'}|{self.created_at.isoformat()}|{self.id}"
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> _Cursor:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
            direction, created_at, row_id = raw.split("|")
            if direction not in {"o", "n"}:
                raise ValueError(direction)
            return cls(_instant(created_at), uuid.UUID(row_id), direction == "o")
        except (ValueError, OverflowError, UnicodeDecodeError, binascii.Error):
            raise InvalidInput(
                "The cursor is not one this API gave out; follow the `next` link as it is.",
                details={"field": "cursor"},
            ) from None


def _instant(text: str) -> datetime:
    """A cursor's timestamp, in UTC as the API writes them. One without an offset
    is not one it gave out; one whose offset carries it past year 1 or 9999
    raises OverflowError (SQLite's adapter would convert it, and fail, later)."""
    at = datetime.fromisoformat(text)
    if at.tzinfo is None:
        raise ValueError("a cursor's timestamp has an offset")
    return at.astimezone(UTC)


@dataclass
class Page:
    rows: list[Any]
    next: str | None
    previous: str | None
    count: int | None = None

    def body(self, results: Any) -> dict[str, Any]:
        body: dict[str, Any] = {} if self.count is None else {"count": self.count}
        return {**body, "next": self.next, "previous": self.previous, "results": results}


def paginate(request: Request, queryset: QuerySet[Any], *, count: bool = False) -> Page:
    """One page of `queryset` (newest first by created_at, then id) for `request`."""
    limit = int_param(request, "limit", DEFAULT_LIMIT, minimum=1, maximum=MAX_LIMIT)
    url = request.build_absolute_uri()
    token = request.query_params.get("cursor")
    newest_first = queryset.order_by("-created_at", "-id")
    total = queryset.order_by().count() if count else None
    if token:
        cursor = _Cursor.decode(token)
        # The first condition alone is the index's range; the second breaks ties.
        at = cursor.created_at
        if cursor.older:
            older = Q(created_at__lte=at) & (Q(created_at__lt=at) | Q(id__lt=cursor.id))
            rows = list(newest_first.filter(older)[: limit + 1])
            more_after, more_before = len(rows) > limit, True
            rows = rows[:limit]
        else:
            newer = Q(created_at__gte=at) & (Q(created_at__gt=at) | Q(id__gt=cursor.id))
            rows = list(queryset.order_by("created_at", "id").filter(newer)[: limit + 1])
            more_after, more_before = True, len(rows) > limit
            rows = list(reversed(rows[:limit]))
    else:
        offset = int_param(request, "offset", 0, minimum=0)
        if offset > MAX_OFFSET:
            raise OffsetTooDeep(
                f"An offset past {MAX_OFFSET} is not answered: it would cost what it skips. "
                "Follow the `next` links (a cursor), which cost the same at any depth.",
                details={"field": "offset", "max": MAX_OFFSET, "value": offset},
            )
        rows = list(newest_first[offset : offset + limit + 1])
        more_after, more_before = len(rows) > limit, offset > 0
        rows = rows[:limit]
    base = remove_query_param(url, "offset")
    return Page(
        rows=rows,
        next=_link(base, rows[-1], older=True) if rows and more_after else None,
        previous=_link(base, rows[0], older=False) if rows and more_before else None,
        count=total,
    )


def _link(url: str, row: Any, *, older: bool) -> str:
    token = _Cursor(row.created_at, row.id, older).encode()
    return replace_query_param(url, "cursor", token)


def int_param(
    request: Request, name: str, default: int, *, minimum: int, maximum: int | None = None
) -> int:
    """As DRF's limit/offset paging read them: a value that is not a whole number,
    or is below `minimum`, is ignored; one above `maximum` is capped."""
    try:
        value = int(request.query_params[name])
    except (KeyError, ValueError):
        return default
    if value < minimum:
        return default
    return min(value, maximum) if maximum is not None else value
