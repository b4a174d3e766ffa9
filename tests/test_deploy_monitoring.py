"""The example Grafana dashboard and Prometheus alert rules in `deploy/` refer
only to metrics that /metrics really exposes, once each kind of event happened."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from chorus import metrics
from chorus.errors import StorageError
from synthesis.engines.base import Engine
from synthesis.models import WorkerHeartbeat
from synthesis.services.execution import job_execute
from tests.conftest import Persona

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = json.loads((ROOT / "deploy" / "grafana" / "chorus.json").read_text())
ALERTS = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
TOKEN = "deploy-test-token"


def dashboard_expressions() -> list[str]:
    return [target["expr"] for panel in DASHBOARD["panels"] for target in panel.get("targets", [])]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in ALERTS["groups"] for rule in group["rules"]]


def referenced(expressions: list[str]) -> set[str]:
    return {name for expr in expressions for name in re.findall(r"\bchorus_[a-z0-9_]+", expr)}


def test_the_dashboard_and_the_rules_are_well_formed() -> None:
    assert DASHBOARD["uid"]
    assert DASHBOARD["title"] == "Chorus"
    assert len(dashboard_expressions()) >= 20
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    rules = alert_rules()
    names = {rule["alert"] for rule in rules}
    # What the issue asks to be alerted on: waits, workers gone, failures.
    assert {"ChorusQueueWaitHigh", "ChorusNoWorkers", "ChorusJobFailureRate"} <= names
    for rule in rules:
        assert rule["expr"].strip()
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        assert re.fullmatch(r"\d+[smh]", rule["for"])


@pytest.mark.django_db(transaction=True)
def test_every_metric_they_reference_is_in_the_metrics_output(
    client: Any, settings: Any, alice: Persona, broker: Any, engine: Engine
) -> None:
    settings.METRICS_TOKEN = TOKEN
    # One of each event behind the series: a submit and a refusal over HTTP, a
    # job run to its end, a storage error, a sweep with repairs, a worker.
    job = alice.client.post("/v1/speech", {"text": "Hello there."}, format="json").json()
    alice.client.post("/v1/speech", {"text": "Hi.", "fromat": "mp3"}, format="json")
    assert job_execute(job_id=job["id"], engine=engine, worker="test:1")["status"] == "succeeded"
    StorageError("The bucket is unreachable.", details={"operation": "put"})
    metrics.observe_sweep({"requeued": 1})
    metrics.observe_job_requeued(priority="normal", reason="worker_lost")
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        name="gpu-1:42", engine="synthetic", device="cpu", started_at=now, seen_at=now
    )

    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    exposed = {
        sample.name
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }

    expressions = dashboard_expressions() + [rule["expr"] for rule in alert_rules()]
    names = referenced(expressions)
    assert len(names) >= 20
    assert names - exposed == set()
