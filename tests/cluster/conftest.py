"""The cluster: a package-wide fixture, built once for every scenario here.

Needs root (network namespaces) and Debian's pgbouncer, haproxy and
redis-sentinel (.ci/run installs them). Where they are missing the tests skip,
unless CHORUS_REQUIRE_CLUSTER=1 (set by CI), where they fail.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.stack import Cluster, running_cluster

NEEDED = ("ip", "unshare", "pgbouncer", "haproxy", "redis-sentinel", "redis-server", "runuser")


def _missing() -> list[str]:
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root")
    return missing


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test`), every scenario on one worker process: the
    cluster is built once per process, and two at once would contend for its
    bridge's addresses."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("cluster"))


@pytest.fixture(scope="package")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    missing = _missing()
    if missing:
        if os.environ.get("CHORUS_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"the cluster tests need {', '.join(missing)}")
        pytest.skip(f"the cluster tests need {', '.join(missing)}")
    failed_before = request.session.testsfailed
    with running_cluster(
        Path("/tmp") / f"chorus-cluster-{os.getpid()}",
        keep_logs_if=lambda: request.session.testsfailed > failed_before,
    ) as built:
        yield built


@pytest.fixture(autouse=True)
def _fresh_rate_windows() -> None:
    """The suite's own Redis (tests/conftest.py) is not on the cluster's network:
    rate windows live in the cluster's broker, fresh with it."""
