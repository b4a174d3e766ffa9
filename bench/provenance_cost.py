"""What Content Credentials add to a job: the worker's write path for 10 s of
speech (encode, then sign, then the put), with and without signing.

Signs with a fresh CA and ES256 signing certificate made for the run (as
`make run` does), in this process, on the real encoder and c2pa-rs; the put
goes to local storage in a temporary folder. Prints a table per format: the
median and p95 of wall time and CPU time per job, unsigned and signed, and
what signing adds.

Usage:
  .venv/bin/python bench/provenance_cost.py --jobs 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="chorus-provenance-bench-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")
    os.environ["CHORUS_DATA_DIR"] = str(scratch / "data")
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{scratch / 'db.sqlite3'}")
    import django

    django.setup()
    import numpy as np

    from synthesis.audio_out import encode_output
    from synthesis.provenance import sign_audio
    from synthesis.storage.local import LocalStorage

    storage = LocalStorage(scratch / "storage", secret="bench", base_url="http://x")
    storage.ensure_bucket("bench")
    rate = 24_000
    t = np.arange(int(args.seconds * rate)) / rate
    speechlike = (0.3 * np.sin(2 * np.pi * 180 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)

    def job(audio_format: str, signed: bool) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        audio = encode_output(speechlike, rate, format=audio_format, sample_rate=None)
        data, sidecar = audio.data, None
        if signed:
            out = sign_audio(
                data=data, audio_format=audio_format, job_id="bench", tenant_id=1, engine="bench"
            )
            data, sidecar = out.data, out.sidecar
        if sidecar is not None:
            storage.put(bucket="bench", key="a.c2pa", data=sidecar, content_type="application/c2pa")
        storage.put(bucket="bench", key=f"a.{audio_format}", data=data, content_type="audio/x")
        return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000

    print(f"{args.jobs} jobs of {args.seconds:g} s each per row; times in ms per job")
    print(
        "| format | unsigned wall p50 | signed wall p50 | added wall p50 | added wall p95 "
        "| unsigned CPU p50 | signed CPU p50 | added CPU p50 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for audio_format in ("wav", "mp3", "flac", "opus", "pcm"):
        job(audio_format, True)  # warm: encoders, the signer and its certificate
        plain, signed = [], []
        for _ in range(args.jobs):  # interleaved, so drift on a shared host hits both
            plain.append(job(audio_format, False))
            signed.append(job(audio_format, True))
        pw, pc = [w for w, _ in plain], [c for _, c in plain]
        sw, sc = [w for w, _ in signed], [c for _, c in signed]
        added = sorted(s - p for s, p in zip(sw, pw, strict=True))
        print(
            f"| {audio_format} | {statistics.median(pw):.2f} | {statistics.median(sw):.2f} "
            f"| {statistics.median(sw) - statistics.median(pw):.2f} "
            f"| {added[int(0.95 * len(added)) - 1]:.2f} "
            f"| {statistics.median(pc):.2f} | {statistics.median(sc):.2f} "
            f"| {statistics.median(sc) - statistics.median(pc):.2f} |"
        )


if __name__ == "__main__":
    main()
