"""The load test runs on a machine with no Chorus service: it imports neither Django
nor Celery, and the service's images, which leave its extra out, say how to get it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

EVERY_MODULE = ", ".join(
    f"chorus_loadtest.{name}"
    for name in ("cli", "client", "options", "plot", "report", "runner", "sampler", "stats")
)


def _python(code: str, *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_importing_every_module_of_the_load_test_loads_neither_django_nor_celery() -> None:
    result = _python(
        f"import sys, {EVERY_MODULE}\n"
        "from chorus_loadtest.plot import draw\n"
        "print(sorted(m for m in ('django', 'celery', 'kombu', 'chorus') if m in sys.modules))"
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_console_script_answers_help_without_django() -> None:
    result = _python(
        "import sys; from chorus_loadtest.cli import main\n"
        "sys.argv = ['chorus-loadtest', '--help']\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    code = exit.code\n"
        "assert 'django' not in sys.modules and 'celery' not in sys.modules, 'loaded'\n"
        "sys.exit(code)"
    )

    assert result.returncode == 0, result.stderr
    assert "usage: chorus-loadtest" in result.stdout
    assert "default 40" in result.stdout


def test_manage_py_loadtest_without_the_extra_says_which_extra_to_install() -> None:
    # httpx set to None in sys.modules: importing it fails as where it is not installed.
    result = _python(
        "import os, sys; sys.modules['httpx'] = None\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'chorus.settings')\n"
        "from django.core.management import execute_from_command_line\n"
        "execute_from_command_line(['manage.py', 'loadtest', '--key', 'ck_x'])"
    )

    assert result.returncode == 2
    assert "pip install 'chorus[loadtest]'" in result.stderr
    assert "httpx is not installed" in result.stderr
    assert "Traceback" not in result.stderr
