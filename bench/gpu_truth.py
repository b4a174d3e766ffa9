"""CosyVoice2 on a real GPU through a real worker, beside the synthetic `t4-cosyvoice2` profile.

What the device emulator assumes, measured: first audio, total time, real-time
factor and GPU memory at 1, 2, 4 and 8 streams at once, through the real stack
(PostgreSQL, Redis, one `celery worker` with CHORUS_ENGINE=cosyvoice2 running
CHORUS_WORKER_STREAMS jobs at once on one loaded model). The model is the real
0.5B architecture with random weights (`manage.py cosyvoice2_dummy_model --size
full`): memory and speed are the real ones, the audio is noise. Its LLM is biased
never to stop, so each request decodes exactly 20 speech tokens per text token:
the text is chosen to give about `--audio-s` seconds (4 s, as in the T4 load test).

Each level submits N streaming jobs at once, `--rounds` times; first audio and
total are taken from the jobs' own timestamps (submission -> first chunk, ->
finished), so they include queueing and dispatch like the published client-side
figures. Memory is the device's used memory (NVML), peak per level.

`--slots K` loads K copies of the model in the worker instead (the alternative to
concurrent calls on one copy): the memory column then shows what each copy costs.

Usage, on a machine with an NVIDIA GPU, PostgreSQL and Redis (as in `make test`),
the `cosyvoice` and `nvml` extras installed, and upstream cloned at ace7c47:
  COSYVOICE_SRC=/opt/CosyVoice .venv/bin/python bench/gpu_truth.py
  (--model-dir DIR reuses a folder built earlier; --streams 1,2,4,8; --rounds 3)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harness import ROOT, percentile, setup, tenant  # one stack set-up for every bench

# Published T4 figures (first audio, total; seconds) at 1-5 streams, used when the
# device-profile module is not importable.
T4_FALLBACK = {
    "first_audio_s": (1.48, 1.52, 1.61, 1.79, 2.13),
    "total_s": (3.20, 3.45, 3.72, 4.18, 4.96),
}
TOKEN_S = 0.04  # one speech token is 40 ms of audio (25 per second)
TOKENS_PER_TEXT_TOKEN = 20  # upstream's length cap, which the dummy LLM always reaches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="a full-size dummy model (built if absent)")
    parser.add_argument("--src", type=Path, default=os.environ.get("COSYVOICE_SRC"))
    parser.add_argument("--streams", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--audio-s", type=float, default=4.0)
    parser.add_argument("--slots", type=int, default=1, help="model copies in the worker")
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args()
    if args.src is None:
        parser.error("set COSYVOICE_SRC or --src to the upstream clone")
    levels = [int(n) for n in args.streams.split(",")]

    model_dir = args.model_dir or Path(tempfile.gettempdir()) / "cosyvoice2-full-dummy"
    if not (model_dir / "chorus-dummy.json").is_file():
        print(f"building the full-size random-weight model in {model_dir} ...", flush=True)
        from synthesis.engines.cosyvoice2_dummy import build_dummy_model

        build_dummy_model(model_dir, size="full", stop="capped", src_dir=args.src)

    setup(broker_slots=max(levels) * 2)
    from synthesis.services.voices import voice_create

    owner = tenant("gpu-truth")
    voice = voice_create(
        tenant=owner, name="bench", audio=_reference_wav(5.0), transcript="A reference."
    )
    text = _text_for(model_dir, args.audio_s)
    memory = _MemorySampler()
    worker = _start_worker(model_dir, args, streams=max(levels))
    try:
        _wait_ready(worker)
        idle_bytes = memory.used()
        rows = []
        for level in levels:
            memory.reset()
            with memory.sampling():
                results = [_round(owner, voice, text, level) for _ in range(args.rounds)]
            rows.append(_row(level, [r for batch in results for r in batch], memory.peak))
        size = json.loads((model_dir / "chorus-dummy.json").read_text())["size"]
        _print(rows, idle_bytes, args, text, size)
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()


def _reference_wav(seconds: float, rate: int = 24000) -> bytes:
    import io

    import numpy as np
    import soundfile

    t = np.arange(round(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(
        buffer, (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), rate, "PCM_16", format="WAV"
    )
    return buffer.getvalue()


def _text_for(model_dir: Path, audio_s: float) -> str:
    """Words until the dummy tokenizer gives audio_s seconds at 20 tokens each."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir / "CosyVoice-BlankEN")
    wanted = max(1, round(audio_s / (TOKENS_PER_TEXT_TOKEN * TOKEN_S)))
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "again",
        "and",
        "again",
    ]
    text = ""
    for word in words * 4:
        candidate = f"{text} {word}".strip()
        if text and len(tokenizer(candidate + ".")["input_ids"]) > wanted:
            break
        text = candidate
    return text + "."


def _start_worker(model_dir: Path, args: Any, *, streams: int) -> subprocess.Popen[str]:
    from synthesis.worker import worker_argv

    env = {
        **os.environ,
        "CHORUS_ENGINE": "cosyvoice2",
        "CHORUS_ENGINE_OPTIONS": json.dumps({"fp16": args.fp16}),
        "COSYVOICE_MODEL_DIR": str(model_dir),
        "COSYVOICE_SRC": str(args.src),
        "CHORUS_ENGINE_SLOTS": str(args.slots),
        "CHORUS_WORKER_STREAMS": str(streams),
    }
    argv = worker_argv(hostname="gputruth@%h", loglevel="WARNING")
    return subprocess.Popen(argv, cwd=ROOT, env=env, text=True)


def _wait_ready(worker: subprocess.Popen[str], timeout: float = 600) -> None:
    from synthesis.models import WorkerHeartbeat

    deadline = time.monotonic() + timeout
    while not WorkerHeartbeat.objects.exists():
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the cosyvoice2 worker did not start")
        time.sleep(0.5)
    time.sleep(2.0)


def _round(owner: Any, voice: Any, text: str, level: int) -> list[dict[str, float]]:
    from synthesis.models import Job
    from synthesis.services.jobs import job_create
    from synthesis.speech_request import SpeechRequest

    jobs = [
        job_create(
            tenant=owner,
            api_key=None,
            speech=SpeechRequest(text=text, voice_id=voice.id, stream=True, format="pcm"),
        )
        for _ in range(level)
    ]
    ids = [job.id for job in jobs]
    deadline = time.monotonic() + 600
    while Job.objects.filter(pk__in=ids, finished_at__isnull=True).exists():
        if time.monotonic() > deadline:
            raise RuntimeError("jobs did not finish")
        time.sleep(0.1)
    out = []
    for job in Job.objects.filter(pk__in=ids):
        if job.status != "succeeded":
            raise RuntimeError(f"job {job.id} {job.status}: {job.error_message}")
        out.append(
            {
                "first": (job.first_audio_at - job.created_at).total_seconds(),
                "total": (job.finished_at - job.created_at).total_seconds(),
                "compute": (job.finished_at - job.started_at).total_seconds(),
                "audio": float(job.duration_s or 0.0),
            }
        )
    return out


def _row(level: int, results: list[dict[str, float]], peak: int) -> dict[str, Any]:
    return {
        "streams": level,
        "first_p50": statistics.median(r["first"] for r in results),
        "first_max": max(r["first"] for r in results),
        "total_p50": statistics.median(r["total"] for r in results),
        "total_p90": percentile([r["total"] for r in results], 0.9),
        "audio": statistics.median(r["audio"] for r in results),
        "rtf": statistics.median(r["compute"] / r["audio"] for r in results if r["audio"]),
        "peak_bytes": peak,
    }


def _t4(level: int) -> tuple[float, float] | None:
    try:
        from synthesis.engines.device_profiles import get_profile

        profile = get_profile("t4-cosyvoice2")
        first, total = profile.first_audio_s, profile.total_s
    except (ImportError, AttributeError, KeyError, ValueError):
        first, total = T4_FALLBACK["first_audio_s"], T4_FALLBACK["total_s"]
    if level > len(first):
        return None
    return first[level - 1], total[level - 1]


def _print(rows: list[dict[str, Any]], idle: int, args: Any, text: str, size: str) -> None:
    print(
        f"\nCosyVoice2 ({size} shapes), random weights, slots={args.slots}, fp16={args.fp16}; "
        f"text {text!r}; GPU memory with the worker idle: {idle / 1e9:.2f} GB"
    )
    print(
        f"{'streams':>7} {'first p50':>9} {'first max':>9} {'total p50':>9} {'total p90':>9} "
        f"{'audio s':>7} {'RTF':>5} {'GPU GB':>6} | {'T4 first':>8} {'T4 total':>8}"
    )
    for row in rows:
        t4 = _t4(row["streams"])
        t4_text = f"{t4[0]:>8.2f} {t4[1]:>8.2f}" if t4 else f"{'-':>8} {'-':>8}"
        print(
            f"{row['streams']:>7} {row['first_p50']:>9.2f} {row['first_max']:>9.2f} "
            f"{row['total_p50']:>9.2f} {row['total_p90']:>9.2f} {row['audio']:>7.2f} "
            f"{row['rtf']:>5.2f} {row['peak_bytes'] / 1e9:>6.2f} | {t4_text}"
        )


class _MemorySampler:
    """Peak used memory of GPU 0 (NVML), sampled every 50 ms while a level runs.

    Without NVML (a dry run on a CPU) every figure is 0.
    """

    def __init__(self) -> None:
        self._handle: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no NVML library or no NVIDIA device
            print("NVML unavailable: GPU memory is not measured", flush=True)
        self.peak = 0
        self._stop = threading.Event()

    def used(self) -> int:
        if self._handle is None:
            return 0
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def reset(self) -> None:
        self.peak = self.used()

    def sampling(self) -> Any:
        sampler = self

        class _Running:
            def __enter__(self) -> None:
                sampler._stop.clear()
                self.thread = threading.Thread(target=sampler._run, daemon=True)
                self.thread.start()

            def __exit__(self, *exc: object) -> None:
                sampler._stop.set()
                self.thread.join()

        return _Running()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.used())


if __name__ == "__main__":
    main()
