"""The load test's dependencies are its own extra, which the service's images leave out."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The import name where it differs from the distribution's.
DISTRIBUTION = {"pynvml": "nvidia-ml-py"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r)[0].lower() for r in requirements}


def _third_party_imports(package: Path) -> set[str]:
    modules: set[str] = set()
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m not in {package.name}}


def test_every_third_party_import_of_the_load_test_is_in_its_extras() -> None:
    extras = PROJECT["optional-dependencies"]
    declared = _names(extras["loadtest"]) | _names(extras["nvml"])

    imported = {DISTRIBUTION.get(m, m) for m in _third_party_imports(ROOT / "chorus_loadtest")}

    assert imported == {"httpx", "psutil", "matplotlib", "nvidia-ml-py"}
    assert imported <= declared


def test_the_service_itself_does_not_depend_on_the_load_tests_http_client_or_plots() -> None:
    assert not {"httpx", "matplotlib"} & _names(PROJECT["dependencies"])


def test_the_dev_install_has_the_load_test_so_its_tests_run() -> None:
    assert "chorus[loadtest,bench]" in PROJECT["optional-dependencies"]["dev"]


def test_the_images_copy_every_django_app_and_not_the_load_test() -> None:
    apps = ["chorus", "tenants", "synthesis", "quotas", "batches", "webhooks"]
    for dockerfile in ("Dockerfile", "Dockerfile.gpu"):
        text = (ROOT / "docker" / dockerfile).read_text()
        copied = set(re.findall(r"^COPY (\S+) \./", text, flags=re.MULTILINE))
        assert set(apps) <= copied, f"{dockerfile} does not copy {set(apps) - copied}"
        assert "chorus_loadtest" not in copied
        commands = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in commands if "loadtest" in line]
