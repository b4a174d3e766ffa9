"""No query string makes a GET route answer 5xx, for the owner of what it names or an
outsider: every query parameter of every GET route in the OpenAPI schema (so a new
route or parameter is covered without a change here) gets crafted values: cursors
with timestamps at the ends of the calendar and odd offsets, days from year 1 to
9999, huge and negative numbers, any text.

Before, a cursor with an extreme timestamp answered 500 on SQLite, and
`GET /v1/usage?period=0001-01-01` on both databases.

Hypothesis runs derandomized (the same examples on every run, so CI is stable),
with a budget that keeps each backend's run well under a minute.
"""

from __future__ import annotations

import base64
import re
from datetime import date, datetime, timedelta, timezone
from functools import cache
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.audio_files import audio_file
from tests.conftest import Persona

pytestmark = pytest.mark.embedded

EXAMPLES_PER_ROUTE = 80


@cache
def get_routes() -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """(path template, its query parameters and their types) of every GET operation
    in the schema; a type is the schema's `format` or `type` (`date`, `integer`, ...)."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    routes = []
    for path, operations in schema["paths"].items():
        if "get" in operations:
            parameters = [p for p in operations["get"].get("parameters", []) if p["in"] == "query"]
            typed = tuple(
                (p["name"], p["schema"].get("format") or p["schema"].get("type", ""))
                for p in parameters
            )
            routes.append((path, typed))
    return tuple(sorted(routes))


def _b64(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


offsets = st.builds(
    timezone,
    st.sampled_from([timedelta(hours=h) for h in (-14, -1, 1, 14)])
    | st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23)),
)
# The ends of the calendar with an offset (half of them carry it past its end).
extremes = st.sampled_from([datetime.min, datetime.max]).flatmap(
    lambda moment: offsets.map(lambda tz: moment.replace(tzinfo=tz))
)
instants = (extremes | st.datetimes(timezones=st.none() | offsets)).map(datetime.isoformat)
# Well-formed but for the instant, at the calendar's ends more often than not: a
# cursor the API could have given out (mangled ones come from `anything`'s text).
cursors = st.builds(
    lambda direction, when, row_id: _b64(f"{direction}|{when}|{row_id}"),
    st.sampled_from(["o", "n"]),
    extremes.map(datetime.isoformat) | instants,
    st.uuids(),
)
days = (st.sampled_from([date.min, date.max, date(1970, 1, 1)]) | st.dates()).map(date.isoformat)
numbers = st.integers(min_value=-(2**70), max_value=2**70).map(str)
anything = st.one_of(
    cursors,
    instants,
    days,
    numbers,
    st.sampled_from(["", "true", "false", "0", "-1", "1e309", "NaN", "9" * 40, "%00"]),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=24),
)
# What the schema says a parameter is comes first; anything else may come too.
BY_TYPE = {"date": days | anything, "integer": numbers | anything}


def values_for(kind: str) -> st.SearchStrategy[str]:
    return BY_TYPE.get(kind, cursors | anything)


@pytest.fixture
def path_values(alice: Persona, broker: Any) -> dict[str, str]:
    """Real ids of alice's objects, one of each kind a GET route names."""
    voice = alice.client.post(
        "/v1/voices",
        {"name": "narrator", "audio": SimpleUploadedFile("ref.wav", audio_file(4.0))},
        format="multipart",
    )
    job = alice.client.post("/v1/speech", {"text": "Hello there."}, format="json")
    batch = alice.client.post("/v1/batches", {"items": [{"text": "Hi."}]}, format="json")
    endpoint = alice.client.post(
        "/v1/webhooks/endpoints", {"url": "https://hooks.example.com/chorus"}, format="json"
    )
    for response in (voice, job, batch, endpoint):
        assert response.status_code in (201, 202), response.content
    return {
        "voice_id": voice.json()["id"],
        "job_id": job.json()["id"],
        "batch_id": batch.json()["id"],
        "endpoint_id": endpoint.json()["id"],
        "bucket": alice.tenant.bucket,
        "key": f"speech/{job.json()['id']}.wav",
    }


def test_the_schema_gives_every_get_route_and_its_parameters() -> None:
    routes = dict(get_routes())
    # A derivation that found nothing would make the test below prove nothing.
    assert routes["/v1/speech"] == (
        ("cursor", "string"),
        ("fields", "string"),
        ("limit", "integer"),
        ("offset", "integer"),
    )
    assert routes["/v1/usage"] == (("period", "date"),)
    assert len(routes) >= 11


@pytest.mark.parametrize(("template", "parameters"), get_routes())
def test_no_query_string_makes_a_get_route_answer_5xx(
    template: str,
    parameters: tuple[tuple[str, str], ...],
    alice: Persona,
    bob: Persona,
    path_values: dict[str, str],
) -> None:
    path = re.sub(r"\{(\w+)\}", lambda m: path_values[m.group(1)], template)

    @settings(
        max_examples=EXAMPLES_PER_ROUTE,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        persona=st.sampled_from([alice, bob]),
        query=st.fixed_dictionaries(
            {}, optional={name: values_for(kind) for name, kind in parameters}
        ),
    )
    def answers_without_5xx(persona: Persona, query: dict[str, str]) -> None:
        response = persona.client.get(path, query)
        assert response.status_code < 500, (path, query, response.content[:300])
        if response.status_code >= 400:
            assert response.json()["error"]["code"]  # the envelope, with a stable code

    answers_without_5xx()


ROW = "00000000-0000-0000-0000-000000000001"


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/v1/usage", {"period": "0001-01-01"}),
        ("/v1/speech", {"cursor": _b64(f"o|0001-01-01T00:00:00+01:00|{ROW}")}),
        ("/v1/voices", {"cursor": _b64(f"n|9999-12-31T23:59:59-01:00|{ROW}")}),
        ("/v1/batches", {"cursor": _b64(f"o|2026-01-01T00:00:00|{ROW}")}),  # no offset
    ],
)
def test_the_probes_that_answered_500_answer_400(
    alice: Persona, path: str, query: dict[str, str]
) -> None:
    response = alice.client.get(path, query)

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_request"
