"""The documentation site builds strictly, and a broken link fails it (CI runs
`make docs`); the README's links into docs/ lead somewhere."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mkdocs_build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )


def site_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    return copy


def test_the_docs_build_strictly_with_the_lifecycle_diagram_drawn(tmp_path: Path) -> None:
    result = mkdocs_build(site_copy(tmp_path), tmp_path / "site")

    assert result.returncode == 0, result.stderr
    lifecycle = (tmp_path / "site" / "job-lifecycle" / "index.html").read_text()
    assert '<pre class="mermaid">' in lifecycle  # left for Mermaid, not shown as code


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = site_copy(tmp_path)
    page = copy / "docs" / "reliability.md"
    page.write_text(page.read_text() + "\nSee [the old notes](no-such-page.md).\n")

    result = mkdocs_build(copy, tmp_path / "site")

    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr


def test_a_page_left_out_of_the_nav_fails_the_build(tmp_path: Path) -> None:
    copy = site_copy(tmp_path)
    (copy / "docs" / "orphan.md").write_text("# Orphan\n")

    result = mkdocs_build(copy, tmp_path / "site")

    assert result.returncode != 0
    assert "orphan.md" in result.stderr


def test_each_link_of_the_readme_into_the_repository_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if not re.match(r"^[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        assert (ROOT / link).exists(), f"README.md links to {link}, which is not there"


def test_ci_builds_the_docs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make docs$", ci, re.M), ".ci/run does not run `make docs`"
    makefile = subprocess.run(
        ["make", "-nB", "docs"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert "mkdocs build --strict" in makefile.stdout
