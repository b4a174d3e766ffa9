"""A profile's curve as a small inline SVG (the admin's Workers table and profiles)."""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString

WIDTH, HEIGHT, PAD = 120, 36, 3


def curve_svg(document: dict[str, Any] | None) -> SafeString | str:
    """First audio (solid) and total time (dashed) against streams, 1 to n."""
    if not document or not document.get("first_audio_s"):
        return "-"
    firsts = [float(v) for v in document["first_audio_s"]]
    totals = [float(v) for v in document.get("total_s", firsts)]
    top = max(totals + firsts) or 1.0
    step = (WIDTH - 2 * PAD) / max(1, len(firsts) - 1)

    def points(values: list[float]) -> str:
        return " ".join(
            f"{PAD + i * step:.1f},{HEIGHT - PAD - (HEIGHT - 2 * PAD) * v / top:.1f}"
            for i, v in enumerate(values)
        )

    pairs = enumerate(zip(firsts, totals, strict=False), start=1)
    title = ", ".join(f"{n}: {f:.2f}/{t:.2f} s" for n, (f, t) in pairs)
    return format_html(
        '<svg width="{}" height="{}" role="img" class="device-curve">'
        "<title>first audio / total at 1.. streams: {}</title>"
        '<polyline fill="none" stroke="#417690" stroke-width="1.5" points="{}"/>'
        '<polyline fill="none" stroke="#999" stroke-dasharray="3 2" points="{}"/></svg>',
        WIDTH,
        HEIGHT,
        title,
        points(firsts),
        points(totals),
    )
