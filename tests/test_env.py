"""Settings read from the environment: a bad value is refused by name, with what
was given; a log level is taken in any case."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from chorus.env import env_choice

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
ROOT = Path(__file__).resolve().parents[1]


def test_a_choice_given_in_lower_case_is_taken_where_case_does_not_matter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHORUS_SOME_LEVEL", " warning ")
    assert env_choice("CHORUS_SOME_LEVEL", "INFO", LEVELS, upper=True) == "WARNING"


def test_a_choice_outside_the_list_names_the_setting_and_what_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHORUS_SOME_LEVEL", "loud")
    with pytest.raises(ImproperlyConfigured, match=r"CHORUS_SOME_LEVEL must be one of .*'loud'"):
        env_choice("CHORUS_SOME_LEVEL", "INFO", LEVELS, upper=True)


def test_where_case_matters_a_choice_in_another_case_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHORUS_SOME_STYLE", "Path")
    with pytest.raises(ImproperlyConfigured, match="'Path'"):
        env_choice("CHORUS_SOME_STYLE", "path", ("path", "virtual"))


def test_the_service_starts_with_a_log_level_in_lower_case() -> None:
    script = "import django, logging; django.setup(); print(logging.getLogger().level)"
    env = {**os.environ, "CHORUS_LOG_LEVEL": "warning", "DJANGO_SETTINGS_MODULE": "chorus.settings"}
    ran = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["30"]  # logging.WARNING
