"""CosyVoice2 on a real GPU: the card's curve as a worker calibrates it, with and without vLLM.

By default (`--mode calibrate`) this runs what a GPU worker runs on a new card
(`synthesis.calibration`, as `manage.py calibrate_device` does): the loaded engine at
1, 2, 3, ... streams at once with a fixed text and reference voice, first audio,
total time, real-time factor and device memory per level, and the stream limits the
curve gives. It measures each of `--variants`:

* `plain`: upstream's default path, each stream decoding on its own;
* `vllm`: `load_vllm` (COSYVOICE_VLLM=1), upstream's vLLM path, which batches the
  language model's decoding across the streams running at once.

and prints the curves side by side with the throughput at each level (seconds of
audio per second, all streams together): what batching gains is the ratio of the
two. The model is the real 0.5B architecture with random weights (`manage.py
cosyvoice2_dummy_model --size full`): memory and speed are the real ones, the audio
is noise. Its language model is biased never to stop, so each request decodes
exactly 20 speech tokens per text token, so every level does the same work.
`--json DIR` writes each variant's profile, in the form CHORUS_DEVICE_PROFILE reads.

`--mode stack` measures through the real stack instead (PostgreSQL, Redis, one
`celery worker` with CHORUS_ENGINE=cosyvoice2 running CHORUS_WORKER_STREAMS jobs at
once): first audio and total from the jobs' own timestamps (submission -> first
chunk, -> finished), so they include queueing and dispatch like the published
client-side T4 figures, beside which it prints them; `--slots K` loads K copies of
the model in the worker instead (memory then shows what each copy costs).

Usage, on a machine with an NVIDIA GPU, the `cosyvoice` and `nvml` extras installed
(and vLLM for the `vllm` variant), upstream cloned at ace7c47, and for `--mode stack`
PostgreSQL and Redis (as in `make test`):
  COSYVOICE_SRC=/opt/CosyVoice .venv/bin/python bench/gpu_truth.py
  (--model-dir DIR reuses a folder built earlier; --variants plain,vllm; --max-streams 16;
   --mode stack --streams 1,2,4,8 --rounds 3)
On a CPU it runs too (the CPU is then the device, with no memory figures), with the
tiny model (`--size tiny`): that is how it is tested, not a measurement.
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


VARIANTS = {"plain": {}, "vllm": {"load_vllm": True}}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("calibrate", "stack"), default="calibrate")
    parser.add_argument("--model-dir", type=Path, help="a dummy model folder (built if absent)")
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument("--src", type=Path, default=os.environ.get("COSYVOICE_SRC"))
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--audio-s", type=float, default=4.0)
    # --mode calibrate
    parser.add_argument("--variants", default="plain,vllm", help="of: " + ",".join(VARIANTS))
    parser.add_argument("--max-streams", type=int, default=16)
    parser.add_argument("--max-seconds", type=float, default=600.0, help="per variant")
    parser.add_argument("--samples", type=int, default=4, help="streams measured per level")
    parser.add_argument(
        "--stop-slowdown",
        type=float,
        default=3.0,
        help="go up until first audio is this many times one stream's (past the limits)",
    )
    parser.add_argument("--json", type=Path, help="a folder for each variant's profile")
    # --mode stack
    parser.add_argument("--streams", default="1,2,4,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slots", type=int, default=1, help="model copies in the worker")
    return parser


def main() -> None:
    args = parser().parse_args()
    if args.src is None:
        parser().error("set COSYVOICE_SRC or --src to the upstream clone")
    model_dir = args.model_dir or Path(tempfile.gettempdir()) / f"cosyvoice2-{args.size}-dummy"
    if not (model_dir / "chorus-dummy.json").is_file():
        print(f"building the {args.size} random-weight model in {model_dir} ...", flush=True)
        from synthesis.engines.cosyvoice2_dummy import build_dummy_model

        build_dummy_model(model_dir, size=args.size, stop="capped", src_dir=args.src)
    if args.mode == "calibrate":
        calibrate_variants(model_dir, args)
    else:
        through_the_stack(model_dir, args)


def calibrate_variants(model_dir: Path, args: Any) -> dict[str, Any]:
    """Each variant's calibration, printed one by one and then side by side."""
    import django

    django.setup()
    from synthesis.calibration.identity import profile_key
    from synthesis.calibration.measure import calibrate
    from synthesis.engines import build_engine
    from synthesis.stream_limits import limits_for_profile

    text = _text_for(model_dir, args.audio_s)
    results: dict[str, Any] = {}
    for variant in [v for v in args.variants.split(",") if v]:
        if variant not in VARIANTS:
            raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
        options = {
            "model_dir": str(model_dir),
            "src_dir": str(args.src),
            "fp16": args.fp16,
            **VARIANTS[variant],
        }
        engine = build_engine("cosyvoice2", options)
        key = profile_key(engine)
        print(f"\n{variant}: {json.dumps(key.parts, sort_keys=True)}", flush=True)
        engine.load()
        try:
            calibration = calibrate(
                engine,
                name=f"{variant}-{key.digest[:12]}",
                stop_slowdown=args.stop_slowdown,
                max_streams=args.max_streams,
                max_seconds=args.max_seconds,
                samples=args.samples,
                text=text,
                progress=lambda line: print(line, flush=True),
            )
        finally:
            engine.close()  # frees the card for the next variant
        limits = limits_for_profile(calibration.profile())
        results[variant] = calibration
        print(
            f"{variant}: stream limits low,normal,high = {limits.as_text()} "
            f"({calibration.stopped_because}; {calibration.seconds:.0f} s)"
        )
        if args.json:
            args.json.mkdir(parents=True, exist_ok=True)
            path = args.json / f"{variant}.json"
            path.write_text(json.dumps(calibration.profile_json(), indent=2) + "\n")
            print(f"{variant}: profile written to {path}")
    print(curves_table(results, text))
    return results


def curves_table(results: dict[str, Any], text: str) -> str:
    """The variants' curves side by side: first audio and total as measured, first
    audio over a lone stream's beside it (`x lone`, what chooses the limits), and
    throughput (audio seconds per second, all streams together) per level; the last
    column, where two variants ran, is the second's throughput over the first's."""
    names = list(results)
    depth = max((len(c.levels) for c in results.values()), default=0)
    head = f"{'streams':>7}" + "".join(
        f" | {name + ' first':>12} {'x lone':>6} {'total':>7} {'audio/s':>7} {'MiB/str':>7}"
        for name in names
    )
    if len(names) == 2:
        head += f" | {names[1] + '/' + names[0]:>11}"
    lines = [f"\ntext {text!r}; times in seconds, one stream's audio per level", head]
    for index in range(depth):
        row = f"{index + 1:>7}"
        throughputs: list[float | None] = []
        for name in names:
            levels = results[name].levels
            if index >= len(levels):
                row += f" | {'-':>12} {'-':>6} {'-':>7} {'-':>7} {'-':>7}"
                throughputs.append(None)
                continue
            level = levels[index]
            throughput = level.streams * level.audio_s / level.total_s if level.total_s else 0.0
            throughputs.append(throughput)
            row += (
                f" | {level.first_audio_s:>12.3f} {level.slowdown:>6.2f} {level.total_s:>7.3f} "
                f"{throughput:>7.2f} "
                f"{level.memory_per_stream / 2**20:>7.0f}"
            )
        if len(names) == 2:
            first, second = throughputs
            gain = f"{second / first:.2f}x" if first and second else "-"
            row += f" | {gain:>11}"
        lines.append(row)
    return "\n".join(lines)


def through_the_stack(model_dir: Path, args: Any) -> None:
    levels = [int(n) for n in args.streams.split(",")]
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
