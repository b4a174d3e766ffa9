"""Every code block in README.md and the docs' pages does what the page says.

The blocks are read from README.md and docs/ when the tests are collected, so the
pages as edited are what is tested (every page but those `UNCHECKED_PAGES` names,
so a new page is checked from its first block). `CHECKS` classifies each block by
its first line:
shell and Python that a reader runs after `make run` run here for real against
`manage.py runstack --demo` (what `make run` starts) on a free port, with the
key and URL it prints exported as `CHORUS_KEY` and `CHORUS_URL` (a block that
writes a port of its own, such as `http://127.0.0.1:8000`, fails: pasted, it
would reach whatever else serves there). What cannot run in a test (make targets,
benchmarks that take minutes, recipes with placeholders) is checked dry: make
targets with `make -n`, manage.py and CLI arguments with their own parsers,
scripts with `--help`, compose commands against docker-compose.yml. A block no
entry classifies fails, so an untested snippet cannot be added.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
import soundfile as sf
import yaml
from django.conf import settings
from django.core.management import get_commands, load_command_class

from batches.models import Batch
from chorus_loadtest.cli import add_arguments as loadtest_arguments
from chorus_loadtest.cli import options_from as loadtest_options
from synthesis.engines import engine_class
from synthesis.models import Job, JobStatus, Voice
from synthesis.worker import worker_argv
from tenants.demo import curl_example
from tests.audio_files import audio_file
from tests.e2e.asgi import free_port
from tests.e2e.conftest import ROOT, collect_lines, stack_env, stop_process
from webhooks.models import WebhookEndpoint

# Once, on the embedded default: a reader runs these after `make run`, on SQLite.
pytestmark = [pytest.mark.e2e, pytest.mark.sqlite_only, pytest.mark.django_db(transaction=True)]

README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Pages whose blocks are not run here: a reader's own cluster and manifests, and a
# page generated from the code, whose test compares it with what it is made from.
UNCHECKED_PAGES = {
    "docs/cluster.md": "tests/cluster runs its scenarios",
    "docs/drain.md": "tests/e2e/test_worker_drain.py and the cluster suite",
    "docs/kubernetes.md": "tests/test_kubernetes_manifests.py renders the manifests",
    "docs/metrics.md": "tests/e2e/test_metrics_port.py and the cluster suite",
    "docs/job-lifecycle.md": "generated from the code, compared with it by its own test",
    # Not yet run live here; the routes and commands they show are tested by:
    "docs/api/audit-events.md": "tests/audit (the route, its filters and pages)",
    "docs/api/consent.md": "tests/synthesis/test_voice_consent.py (the form field, the codes)",
    "docs/provenance.md": "tests/synthesis/test_provenance.py (signing, the route, the command)",
}
HARD_CODED_URL = re.compile(r"https?://(127\.0\.0\.1|localhost):\d+")
ESPEAK_RATE = 22050  # the README: "espeak is 22.05 kHz"; `make run` runs espeak
# Placeholders the README writes where a reader puts their own value.
PLACEHOLDERS = {"ck_...": "ck_placeholder", "PID": "1", "SECONDS": "1", "VOICE_ID": "v1"}
# What the README says each make target does, as it shows in `make -n`.
MAKE_CLAIMS = {
    "run": ("pip install", "manage.py migrate", "manage.py runstack --demo"),
    "test": ("@127.0.0.1:5432/", "redis://127.0.0.1:6379/", "-m pytest", "sqlite:///"),
    "lint": ("ruff check", "mypy"),
    "docs": ("mkdocs build --strict",),
}


# --- the pages' blocks ---------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    page: str  # README.md, docs/....md
    line: int  # of the opening fence
    lang: str
    text: str

    @property
    def first_line(self) -> str:
        return next((line for line in self.text.splitlines() if line.strip()), "")

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def checked_pages() -> dict[str, str]:
    """Each checked page's text by its path from the repository root."""
    paths = [README, *sorted(DOCS.rglob("*.md"))]
    names = (path.relative_to(ROOT).as_posix() for path in paths)
    return {name: (ROOT / name).read_text() for name in names if name not in UNCHECKED_PAGES}


def readme_blocks(text: str, page: str = "README.md") -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)\s*$", lines[index])
        index += 1
        if not opening:
            continue
        indent, fence, lang = opening.groups()
        start, body = index, []
        while index < len(lines) and lines[index].strip() != fence:
            body.append(lines[index].removeprefix(indent))
            index += 1
        assert index < len(lines), f"{page}:{start}: unclosed code block"
        index += 1
        blocks.append(Block(page=page, line=start, lang=lang, text="\n".join(body) + "\n"))
    return blocks


def readme_inline_commands(text: str) -> list[str]:
    """Inline code outside blocks that is a make or compose command a reader runs."""
    prose = re.sub(r"^(`{3,}).*?^\1\s*$", "", text, flags=re.M | re.S)
    spans = (" ".join(span.split()) for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", prose))
    return sorted({span for span in spans if span.startswith(("make ", "docker compose "))})


PAGES = checked_pages()
BLOCKS = [block for page, text in PAGES.items() for block in readme_blocks(text, page)]
INLINE_COMMANDS = sorted({cmd for text in PAGES.values() for cmd in readme_inline_commands(text)})


# --- the stack a reader has after `make run` ------------------------------------------


@dataclass
class Stack:
    url: str
    key: str
    lines: list[str] = field(default_factory=list)

    @property
    def printed(self) -> str:
        return "".join(self.lines)


@pytest.fixture
def readme_stack(transactional_db: None, broker: Any, tmp_path: Path) -> Iterator[Stack]:
    """`manage.py runstack --demo` on the test database and Redis, on a free port."""
    port = free_port()
    env = stack_env(
        {
            "CHORUS_ENGINE": "espeak",  # `make run`'s engine, for the web tier and the worker
            "CHORUS_ENGINE_OPTIONS": "{}",
            "CHORUS_DATA_DIR": str(tmp_path / "var"),
            "PYTHONUNBUFFERED": "1",
            # The tour's webhook receiver listens on loopback, as the page says to allow.
            "CHORUS_WEBHOOK_ALLOW_PRIVATE": "true",
        }
    )
    env.pop("CHORUS_PUBLIC_URL", None)
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runstack", "--demo", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    stack = Stack(url=f"http://127.0.0.1:{port}", key="")
    threading.Thread(target=collect_lines, args=(process, stack.lines), daemon=True).start()
    try:
        deadline = time.monotonic() + 90
        while "saved hello.wav" not in stack.printed:  # the snippet's last line
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail("runstack did not start:\n" + stack.printed)
            time.sleep(0.1)
        printed_key = re.search(r"^\s+(ck_\S+)$", stack.printed, re.M)
        assert printed_key, stack.printed
        stack.key = printed_key.group(1)
        yield stack
    finally:
        stop_process(process)


def reader_env(**extra: str) -> dict[str, str]:
    """A reader's shell: nothing of the test's configuration, only what they export."""
    own = ("CHORUS_", "DJANGO_", "OPENAI_", "DATABASE_URL", "REDIS_URL")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(own)}, **extra}


def run_bash(script: str, *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # -u: a variable the reader does not have (`$KEY`) fails instead of expanding to "".
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def on_stack(text: str, stack: Stack) -> dict[str, str]:
    """The reader's shell after pasting what `make run` printed: CHORUS_URL and CHORUS_KEY."""
    assert "CHORUS_URL" in text, "the block does not call $CHORUS_URL, where `make run` serves"
    assert not HARD_CODED_URL.search(text), "the block writes a port: use $CHORUS_URL"
    return reader_env(CHORUS_URL=stack.url, CHORUS_KEY=stack.key)


def wav_audio(data: bytes) -> tuple[int, np.ndarray]:
    """A WAV's rate and samples (mono s16le), read by its chunks: a streamed WAV's
    sizes say "unknown" (0xFFFFFFFF), so the samples run to the end of the body."""
    assert (data[:4], data[8:12]) == (b"RIFF", b"WAVE"), f"not a WAV: {data[:200]!r}"
    position, rate = 12, 0
    while position + 8 <= len(data):
        chunk, size = data[position : position + 4], _u32(data, position + 4)
        body = data[position + 8 : position + 8 + size]
        if chunk == b"fmt ":
            pcm, channels, bits = _u16(body, 0), _u16(body, 2), _u16(body, 14)
            assert (pcm, channels, bits) == (1, 1, 16), "not mono 16-bit PCM"
            rate = _u32(body, 4)
        elif chunk == b"data":
            assert rate, "a data chunk before the fmt chunk"
            samples = np.frombuffer(body[: len(body) // 2 * 2], "<i2")
            assert len(samples) > rate // 10, f"{len(samples)} samples: no audio"
            assert np.abs(samples.astype(np.int32)).max() > 1000, "silence, not audio"
            return rate, samples
        position += 8 + size + size % 2
    raise AssertionError("a WAV without a data chunk")


def _u16(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 2], "little")


def _u32(data: bytes, at: int) -> int:
    return int.from_bytes(data[at : at + 4], "little")


# --- live: what a reader runs after `make run` ----------------------------------------


def run_streaming_curl(block: Block, request: pytest.FixtureRequest) -> None:
    stack: Stack = request.getfixturevalue("readme_stack")
    cwd = request.getfixturevalue("tmp_path") / "reader"
    result = run_bash(block.text, cwd=cwd, env=on_stack(block.text, stack))

    assert result.returncode == 0, result.stderr
    rate, _ = wav_audio((cwd / "hello.wav").read_bytes())
    assert rate == ESPEAK_RATE  # "the stream is at the engine's own rate"
    job = Job.objects.get()
    assert (job.status, job.stream, job.format) == (JobStatus.SUCCEEDED, True, "wav")


# The block runs unchanged but for its key and URL; what its loop received is
# read back from its variables.
OPENAI_RUNNER = """
import json, sys
namespace = {"__name__": "__main__"}
exec(compile(sys.stdin.read(), "README.md", "exec"), namespace)
chunk = namespace.get("chunk")
print(json.dumps({"chunk": len(chunk) if isinstance(chunk, bytes) else repr(chunk)}))
"""


def run_openai_client(block: Block, request: pytest.FixtureRequest) -> None:
    stack: Stack = request.getfixturevalue("readme_stack")
    cwd = request.getfixturevalue("tmp_path") / "reader"
    cwd.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", OPENAI_RUNNER],
        input=block.text,
        cwd=cwd,
        env=on_stack(block.text, stack),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    last_chunk = json.loads(result.stdout.splitlines()[-1])["chunk"]
    assert isinstance(last_chunk, int), f"the loop received {last_chunk}"
    assert last_chunk > 0, "the loop received an empty chunk"
    info = sf.info(str(cwd / "hi.mp3"))
    assert (info.format, info.frames > 0) == ("MP3", True)
    samples, _ = sf.read(str(cwd / "hi.mp3"))
    assert np.abs(samples).max() > 0.05, "hi.mp3 is silent"
    jobs = {job.format: job for job in Job.objects.all()}
    assert Job.objects.count() == len(jobs) == 2
    assert sorted(jobs) == ["mp3", "pcm"]
    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
    assert jobs["pcm"].sample_rate == ESPEAK_RATE  # "espeak is 22.05 kHz"


def run_voice_tour(block: Block, request: pytest.FixtureRequest) -> None:
    """Upload reference.wav, speak with it, poll, download mine.mp3."""
    stack: Stack = request.getfixturevalue("readme_stack")
    cwd = request.getfixturevalue("tmp_path") / "reader"
    cwd.mkdir()
    (cwd / "reference.wav").write_bytes(audio_file(5.0, 24000))
    result = run_bash(block.text, cwd=cwd, env=on_stack(block.text, stack))

    assert result.returncode == 0, result.stdout + result.stderr
    voice = Voice.objects.get()
    job = Job.objects.get()
    assert f"voice {voice.id}, job {job.id}: saved mine.mp3" in result.stdout
    assert (job.status, job.voice_id, job.format) == (JobStatus.SUCCEEDED, voice.id, "mp3")
    samples, _ = sf.read(str(cwd / "mine.mp3"))
    assert np.abs(samples).max() > 0.05, "mine.mp3 is silent"


def run_batch_tour(block: Block, request: pytest.FixtureRequest) -> None:
    """Three items, the batch and its archive awaited, batch.zip downloaded."""
    stack: Stack = request.getfixturevalue("readme_stack")
    cwd = request.getfixturevalue("tmp_path") / "reader"
    result = run_bash(block.text, cwd=cwd, env=on_stack(block.text, stack))

    assert result.returncode == 0, result.stdout + result.stderr
    batch = Batch.objects.get()
    assert f"batch {batch.id}: saved batch.zip" in result.stdout
    with zipfile.ZipFile(cwd / "batch.zip") as archive:
        names = archive.namelist()
    assert "manifest.json" in names
    assert sum(name.endswith(".wav") for name in names) == 3
    assert set(Job.objects.values_list("status", flat=True)) == {JobStatus.SUCCEEDED}


def run_python(block: Block, stack: Stack, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A Python block as a reader runs it after `make run`, in `cwd`."""
    return subprocess.run(
        [sys.executable, "-c", block.text],
        cwd=cwd,
        env=on_stack(block.text, stack),
        capture_output=True,
        text=True,
        timeout=90,
    )


def run_webhook_tour(block: Block, request: pytest.FixtureRequest) -> None:
    """The receiver registers itself, a job succeeds, and the signed event it
    verifies is the job's."""
    stack: Stack = request.getfixturevalue("readme_stack")
    cwd = request.getfixturevalue("tmp_path") / "reader"
    cwd.mkdir()
    result = run_python(block, stack, cwd)

    assert result.returncode == 0, result.stderr
    job = Job.objects.get()
    assert result.stdout.splitlines() == [f"speech.succeeded {job.id} succeeded"], (
        result.stdout + result.stderr + stack.printed
    )
    assert WebhookEndpoint.objects.get().url.startswith("http://127.0.0.1:")


def run_realtime_tour(block: Block, request: pytest.FixtureRequest) -> None:
    """The agent's pieces spoken over a realtime session, saved as reply.wav."""
    stack: Stack = request.getfixturevalue("readme_stack")
    cwd = request.getfixturevalue("tmp_path") / "reader"
    cwd.mkdir()
    result = run_python(block, stack, cwd)

    assert result.returncode == 0, result.stderr + stack.printed
    job = Job.objects.get()
    text = "Hello! I am reading this as it is written. Bye for now"
    assert result.stdout.splitlines() == [
        f"session {job.id}: {len(text)} characters, saved reply.wav"
    ]
    assert (job.status, job.realtime, job.text, job.characters) == (
        JobStatus.SUCCEEDED,
        True,
        text,
        len(text),
    )
    rate, samples = wav_audio((cwd / "reply.wav").read_bytes())
    assert rate == 24000
    assert len(samples) / rate == pytest.approx(job.duration_s, abs=0.01)
    assert np.abs(samples).max() > 1000, "reply.wav is silent"


def test_the_snippet_make_run_prints_saves_hello_wav(readme_stack: Stack, tmp_path: Path) -> None:
    snippet = curl_example(base_url=readme_stack.url, key=readme_stack.key)
    # What a reader pastes, verbatim, and last: nothing printed after it pushes it away.
    assert readme_stack.printed.endswith(snippet)
    assert f"export CHORUS_URL={readme_stack.url}\n" in snippet  # the port it serves on

    # Pasted into another terminal: the snippet exports the key itself.
    result = run_bash(snippet, cwd=tmp_path / "reader", env=reader_env())

    assert result.returncode == 0, result.stdout + result.stderr
    submitted = json.loads(result.stdout.splitlines()[0])
    assert submitted["status"] in ("pending", "queued")  # so the loop had to wait
    assert f"job {submitted['id']}: succeeded" in result.stdout
    assert "saved hello.wav" in result.stdout
    wav_audio((tmp_path / "reader" / "hello.wav").read_bytes())


# --- dry: what cannot run in a test ---------------------------------------------------


def shell_commands(text: str) -> list[list[str]]:
    """The block's commands as argv lists (continuations joined, comments dropped,
    `a && b` and a trailing `&` split)."""
    commands: list[list[str]] = []
    for line in text.replace("\\\n", " ").splitlines():
        current: list[str] = []
        for token in shlex.split(line, comments=True):
            if token in ("&&", "&", ";"):
                commands.append(current)
                current = []
            else:
                current.append(token)
        commands.append(current)
    return [command for command in commands if command]


def placeholders(argv: list[str], tmp_path: Path) -> list[str]:
    return [PLACEHOLDERS.get(arg, str(tmp_path / "out") if arg == "DIR" else arg) for arg in argv]


def check_make(argv: list[str]) -> None:
    """`make -nB` prints what a target would do: the target exists, and each
    variable given on the command line changes what it does."""
    assert argv[0] == "make"
    targets = [arg for arg in argv[1:] if "=" not in arg]
    variables = dict(arg.split("=", 1) for arg in argv[1:] if "=" in arg)
    # `VAR=...` in the README: a value of our own, to see it in what make would run.
    given = {name: f"readme-{name}" if "..." in v else v for name, v in variables.items()}
    result = subprocess.run(
        ["make", "-nB", *targets, *(f"{name}={value}" for name, value in given.items())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    for name, value in given.items():
        assert value in result.stdout, f"make {' '.join(targets)} ignores {name}"
    for target in targets if not variables else ():  # the claims are of the defaults
        for claim in MAKE_CLAIMS.get(target, ()):
            assert claim in result.stdout, f"make {target} does not run {claim!r}"


def check_make_commands(block: Block, request: pytest.FixtureRequest) -> None:
    for argv in shell_commands(block.text):
        check_make(argv)


def check_compose(argv: list[str]) -> None:
    """A compose command names only services and profiles docker-compose.yml has."""
    assert argv[:2] == ["docker", "compose"]
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    profiles = {profile for spec in services.values() for profile in spec.get("profiles", [])}
    args = argv[2:]
    while args and args[0].startswith("-"):
        option, value, *args = args
        assert option == "--profile", f"compose option {option} is not checked here"
        assert value in profiles, f"no compose profile {value!r}"
    subcommand, *names = args
    assert subcommand in {"up", "down", "build", "pull", "logs", "ps", "restart", "stop"}
    for name in names:
        assert name.startswith("-") or name in services, f"no compose service {name!r}"


def loadtest_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chorus-loadtest", allow_abbrev=False)
    loadtest_arguments(parser)
    return parser


def check_loadtest_args(args: list[str]) -> dict[str, Any]:
    parser = loadtest_parser()
    known = {option for action in parser._actions for option in action.option_strings}
    for arg in args:
        assert not arg.startswith("--") or arg in known, f"chorus-loadtest has no {arg}"
    values = vars(parser.parse_args(args))
    loadtest_options(values)  # the checks the tool makes before it starts
    return values


def check_loadtest_synopsis(block: Block, request: pytest.FixtureRequest) -> None:
    """The usage: the required part with each optional group (each alternative of
    `a | b`) is a command line the tool takes."""
    tmp_path = request.getfixturevalue("tmp_path")
    text = " ".join(block.text.replace("\\\n", " ").split())
    program, *required = shlex.split(re.sub(r"\[[^\]]*\]", "", text))
    # The virtualenv's script: `make install` does not put it on the PATH.
    assert program == ".venv/bin/chorus-loadtest", program
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get(Path(program).name) == "chorus_loadtest.cli:main"
    groups = re.findall(r"\[([^\]]*)\]", text)
    assert groups, "the usage shows no options"
    for group in groups:
        for alternative in group.split("|"):
            # `--worker-pid PID ...`: repeatable, shown once here.
            argv = shlex.split(re.sub(r"\s+\.\.\.\s*$", "", alternative))
            check_loadtest_args(placeholders([*required, *argv], tmp_path))


@dataclass
class Recipe:
    env: dict[str, str] = field(default_factory=dict)
    databases: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)


def check_manage(argv: list[str], recipe: Recipe) -> None:
    name, *args = argv
    commands = get_commands()
    assert name in commands, f"no management command {name!r}"
    command = load_command_class(commands[name], name)
    options = vars(command.create_parser("manage.py", name).parse_args(args))
    if name == "runstack":
        recipe.ports.append(options["port"])
    if options.get("plan"):
        seeded = importlib.import_module("tenants.migrations.0002_seed_plans").PLANS
        assert options["plan"] in seeded, f"no seeded plan {options['plan']!r}"


def check_script(argv: list[str], recipe: Recipe, tmp_path: Path) -> None:
    """A script that takes minutes starts in the block's environment: `--help`."""
    script, *args = argv
    assert (ROOT / script).is_file(), f"no {script}"
    result = subprocess.run(
        [sys.executable, script, *args, "--help"],
        cwd=ROOT,
        env={**os.environ, **recipe.env, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")


def check_recipe(block: Block, request: pytest.FixtureRequest) -> None:
    """Each command of a recipe that cannot run here (minutes of benchmark, a
    database of its own, placeholders) is checked by what it runs, and the
    commands agree with each other."""
    tmp_path = request.getfixturevalue("tmp_path")
    recipe = Recipe()
    for argv in shell_commands(block.text):
        while argv and re.match(r"^[A-Z_]+=", argv[0]):
            recipe.env.update([argv.pop(0).split("=", 1)])
        if argv[0] == "export":
            recipe.env.update(arg.split("=", 1) for arg in argv[1:])
            continue
        program = os.path.normpath(argv[0])
        if program == "createdb":  # not run: it would create a database here
            assert argv[1:-1] == ["-h", "127.0.0.1", "-U", "postgres"], argv
            recipe.databases.append(argv[-1])
        elif program == ".venv/bin/python" and argv[1] == "manage.py":
            check_manage(argv[2:], recipe)
        elif program == ".venv/bin/python":
            check_script(argv[1:], recipe, tmp_path)
        elif program == ".venv/bin/chorus-loadtest":
            values = check_loadtest_args(placeholders(argv[1:], tmp_path))
            if recipe.ports:
                assert urlsplit(values["url"]).port in recipe.ports, "not the port it started"
        elif program == "make":
            check_make(argv)
        else:
            pytest.fail(f"{block.where}: no check for {argv[0]!r}; add one")
    source = (ROOT / "chorus" / "settings.py").read_text()
    for variable in recipe.env:
        assert f'"{variable}"' in source, f"{variable} is not read by the settings"
    if recipe.databases:
        database = urlsplit(recipe.env["DATABASE_URL"]).path.lstrip("/")
        assert database in recipe.databases, "DATABASE_URL is not the database it creates"
    if "CHORUS_ENGINE" in recipe.env:
        options = json.loads(recipe.env.get("CHORUS_ENGINE_OPTIONS", "{}"))
        if "state_dir" in options:
            options["state_dir"] = str(tmp_path / "engine")  # its files, not the README's
        engine_class(recipe.env["CHORUS_ENGINE"])(**options)  # the options it takes


def check_diagram(block: Block, request: pytest.FixtureRequest) -> None:
    """Not a command, but it names the queues and the worker's command line."""
    queues = re.search(r"Redis: (.+)$", block.text, re.M)
    assert queues, "the diagram shows no queues"
    assert tuple(queues.group(1).split(" / ")) == settings.SYNTH_QUEUES
    command = re.search(r"\((celery [^)]+)\)", block.text)
    assert command, "the diagram shows no worker command"
    shown = command.group(1).split()
    assert worker_argv()[2 : 2 + len(shown)] == shown  # after `python -m`


def check_log_lines(block: Block, request: pytest.FixtureRequest) -> None:
    """Log lines as the README shows them: JSON objects with the fields the
    request and job lines carry (tests/e2e/test_observability.py sees them live)."""
    for line in block.text.splitlines():
        entry = json.loads(line)
        assert {"ts", "level", "logger", "message", "event", "request_id", "tenant_id"} <= set(
            entry
        )
        if entry["event"] == "request":
            assert {"method", "route", "status", "duration_ms"} <= set(entry)
        else:
            assert {"job_id", "worker", "attempt", "status", "code"} <= set(entry)


def check_webhook_body(block: Block, request: pytest.FixtureRequest) -> None:
    """The body shown is the one the service builds: the same fields, no more."""
    from webhooks.events import job_event_data

    shown = json.loads(block.text)
    assert list(shown) == ["type", "timestamp", "data"]
    job = Job(status=JobStatus.SUCCEEDED, characters=12, format="wav")
    built = set(job_event_data(job)) | {"audio_url", "audio_url_expires_at"}
    assert set(shown["data"]) == built


def run_webhook_receiver(block: Block, request: pytest.FixtureRequest) -> None:
    """The receiver runs as written on a delivery signed by the service: it returns
    the event, drops its retry, and refuses a forged body."""
    from datetime import UTC, datetime

    from standardwebhooks import WebhookVerificationError

    from webhooks.signing import secret_generate, signed_headers

    namespace: dict[str, Any] = {}
    exec(compile(block.text, block.page, "exec"), namespace)
    secret = secret_generate()
    body = '{"type":"batch.completed","timestamp":"2026-12-01T11:18:09Z","data":{}}'
    headers = signed_headers(secret=secret, webhook_id="msg_1", body=body, at=datetime.now(tz=UTC))
    receive = namespace["receive"]
    assert receive(body.encode(), headers, secret)["type"] == "batch.completed"
    assert receive(body.encode(), headers, secret) is None  # the same webhook-id again
    with pytest.raises(WebhookVerificationError):
        receive(body.replace("{}", '{"x":1}').encode(), headers, secret)


# --- the classification -----------------------------------------------------------------


# A block's first line (its start) → how it is checked. A block no entry names
# fails the test: add an entry whose check proves what the README claims.
def check_screenshot_command(block: Block, request: pytest.FixtureRequest) -> None:
    """The overview screenshot needs a browser and a running Chorus with an admin:
    `tests/browser/` runs the script for real; here the block's command must be
    one its parser takes, and the variable it sets one the script reads."""
    (argv,) = shell_commands(block.text)
    env = dict([argv.pop(0).split("=", 1)])
    script = argv[1]
    assert argv[0] == ".venv/bin/python", argv
    source = (ROOT / script).read_text()
    assert all(f'"{name}"' in source for name in env), f"{script} does not read {list(env)}"
    check_script(argv[1:], Recipe(env=env), request.getfixturevalue("tmp_path"))


CHECKS: dict[str, Callable[[Block, pytest.FixtureRequest], None]] = {
    "make ": check_make_commands,  # make -nB: the targets and what they run
    "curl -N ": run_streaming_curl,  # live: a streamed hello.wav
    "# The official client;": run_openai_client,  # live: hi.mp3 and streamed pcm
    "client ─HTTP─▶ web": check_diagram,  # the queues and the worker command
    ".venv/bin/chorus-loadtest --url": check_loadtest_synopsis,  # every option, by its parser
    "createdb ": check_recipe,  # benchmarks (minutes): each command dry
    "COSYVOICE_SRC=": check_recipe,  # the GPU bench: dry (no GPU here)
    "export CHORUS_DATA_DIR=": check_recipe,  # the load-test recipe: each command dry
    '{"ts": ': check_log_lines,  # log lines: the fields a request's and a job's carry
    '{"type": "speech.succeeded"': check_webhook_body,  # the fields the service sends
    "from standardwebhooks import Webhook": run_webhook_receiver,  # on a signed delivery
    "# A voice of your own": run_voice_tour,  # live: upload, speak with it, mine.mp3
    "# A batch": run_batch_tour,  # live: three items and the archive's zip
    "# A webhook receiver": run_webhook_tour,  # live: a signed delivery, verified
    "# A realtime session": run_realtime_tour,  # live: pieces in, reply.wav out
    "CHORUS_ADMIN_PASSWORD=": check_screenshot_command,  # run for real in tests/browser
}


def classify(block: Block) -> Callable[[Block, pytest.FixtureRequest], None]:
    matches = [check for start, check in CHECKS.items() if block.first_line.startswith(start)]
    assert len(matches) == 1, (
        f"{block.where}: the block starting {block.first_line!r} matches "
        f"{len(matches)} entries of CHECKS; give it exactly one, with a check of what it claims"
    )
    return matches[0]


@pytest.mark.parametrize("block", BLOCKS, ids=[block.where for block in BLOCKS])
def test_each_readme_block_does_what_the_readme_says(
    block: Block, request: pytest.FixtureRequest
) -> None:
    classify(block)(block, request)


@pytest.mark.parametrize("command", INLINE_COMMANDS)
def test_each_inline_make_or_compose_command_exists(command: str) -> None:
    argv = shlex.split(command)
    if argv[0] == "make":
        check_make(argv)
    else:
        check_compose(argv)


def test_each_classification_names_a_block_still_in_the_pages() -> None:
    for start in CHECKS:
        assert any(block.first_line.startswith(start) for block in BLOCKS), (
            f"no block of README.md or docs/ starts with {start!r}: remove the entry"
        )
