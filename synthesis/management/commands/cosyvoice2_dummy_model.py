from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from synthesis.engines.cosyvoice2_dummy import SIZES, STOPS, build_dummy_model


class Command(BaseCommand):
    help = (
        "Write a CosyVoice2 model folder with random weights, built from upstream's own "
        "classes: 'tiny' for tests on a CPU, 'full' (the 0.5B shapes) for measuring a GPU. "
        "Its audio is noise; its memory, speed and code paths are real."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("out", type=Path, help="the folder to write (COSYVOICE_MODEL_DIR)")
        parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
        parser.add_argument(
            "--stop",
            choices=STOPS,
            default="capped",
            help="stop-token bias: capped (decode to upstream's cap, 20 tokens per text "
            "token), short (stop as early as upstream allows) or random",
        )
        parser.add_argument("--seed", type=int, default=1986)
        parser.add_argument(
            "--src",
            type=Path,
            default=os.environ.get("COSYVOICE_SRC") or None,
            help="the upstream CosyVoice source (default: COSYVOICE_SRC)",
        )

    def handle(
        self, *args: Any, out: Path, size: str, stop: str, seed: int, src: Path | None, **_: Any
    ) -> None:
        started = time.monotonic()
        try:
            build_dummy_model(out, size=size, stop=stop, seed=seed, src_dir=src)
        except ImportError as exc:
            raise CommandError(
                f"cannot import the CosyVoice runtime or its dependencies ({exc}): set "
                "COSYVOICE_SRC (or --src) and pip install -e '.[cosyvoice]'"
            ) from exc
        megabytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20
        self.stdout.write(
            f"{size} CosyVoice2 with random weights in {out} "
            f"({megabytes:.0f} MB, {time.monotonic() - started:.1f} s)"
        )
