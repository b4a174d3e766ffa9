"""The benchmarks run by hand (minutes each) and no test runs them whole, so a rename
in the service would break one unseen. These checks are cheap: every bench answers
`--help`, and every name a bench imports from the service, or reads off a module of
it (`overview.overview_read`), still exists."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
SERVICE = ("chorus", "chorus_loadtest", "tenants", "synthesis", "quotas", "batches", "webhooks")
BENCHES = sorted(p for p in BENCH.glob("*.py") if "__main__" in p.read_text())
# Sibling modules the benches import from each other (`import harness`).
SIBLINGS = {p.stem for p in BENCH.glob("*.py")}


def _module(name: str) -> ModuleType | None:
    top = name.split(".")[0]
    if top in SIBLINGS:
        # A bench sets its defaults (DATABASE_URL, CHORUS_LOG_LEVEL, sys.path) as it
        # loads: kept from the rest of the suite, whose worker processes inherit them.
        environ, path = dict(os.environ), list(sys.path)
        sys.path.append(str(BENCH))
        try:
            return importlib.import_module(name)
        finally:
            os.environ.clear()
            os.environ.update(environ)
            sys.path[:] = path
    if top in SERVICE:
        return importlib.import_module(name)
    return None


def _missing(path: Path) -> list[str]:
    """`module.name` for every imported name of the service (or of a sibling bench)
    that does not exist, and for every attribute read off such a module."""
    missing: list[str] = []
    modules: dict[str, ModuleType] = {}
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = _module(alias.name)
                if module is not None and "." not in alias.name:
                    modules[alias.asname or alias.name] = module
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = _module(node.module)
            if module is None:
                continue
            for alias in node.names:
                if hasattr(module, alias.name):
                    value = getattr(module, alias.name)
                    if isinstance(value, ModuleType):
                        modules[alias.asname or alias.name] = value
                    continue
                try:  # a submodule not imported by its package
                    modules[alias.asname or alias.name] = importlib.import_module(
                        f"{node.module}.{alias.name}"
                    )
                except ModuleNotFoundError:
                    missing.append(f"{node.module}.{alias.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and not hasattr(modules[node.value.id], node.attr)
        ):
            missing.append(f"{modules[node.value.id].__name__}.{node.attr}")
    return missing


@pytest.mark.parametrize("path", BENCHES, ids=[p.name for p in BENCHES])
def test_every_name_a_bench_takes_from_the_service_exists(path: Path) -> None:
    assert _missing(path) == []


def test_the_check_finds_a_name_that_is_gone(tmp_path: Path) -> None:
    bench = tmp_path / "renamed.py"
    bench.write_text(
        "def main():\n"
        "    from synthesis.models import Job, JobGone\n"
        "    from synthesis import overview\n"
        "    return overview.overview_read, overview.no_such_part, Job\n"
    )

    assert _missing(bench) == ["synthesis.models.JobGone", "synthesis.overview.no_such_part"]


def test_every_bench_answers_help() -> None:
    def help_of(path: Path) -> tuple[str, int, str]:
        result = subprocess.run(
            [sys.executable, str(path), "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return path.name, result.returncode, result.stdout + result.stderr

    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = list(pool.map(help_of, BENCHES))

    failed = {name: output[-2000:] for name, code, output in answers if code != 0}
    assert failed == {}
    assert all("usage:" in output for _, _, output in answers)
