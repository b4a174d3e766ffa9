"""The overview's charts as SVG drawn on the server: no script, no library, no CDN,
so the page works offline and in any browser. Each chart has axes with ticks,
times in UTC, a legend, and a <title> per bar for the exact number."""

from __future__ import annotations

import math
from collections.abc import Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from synthesis.overview import Latency, Minute

SUCCEEDED, FAILED, CANCELLED = "#417690", "#ba2121", "#999999"
P50, P95 = "#417690", "#a9c5d6"
FONT = 'font-family="sans-serif" font-size="11" fill="currentColor"'


def _n(value: float) -> str:
    """A coordinate: format_html escapes its arguments to strings, so no format specs."""
    return f"{value:.1f}"


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value`."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value)


def _y_axis(
    *, top: float, left: int, right: int, y0: int, height: int, label: str, fmt: str
) -> SafeString:
    ticks = [top * i / 4 for i in range(5)]
    lines = format_html_join(
        "",
        '<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="#ccc" stroke-width="0.5"/>'
        '<text x="{}" y="{}" text-anchor="end" ' + FONT + ">{}</text>",
        (
            (left, right, y, y, left - 4, y + 4, format(t, fmt))
            for t in ticks
            for y in [round(y0 - height * t / top)]
        ),
    )
    return format_html(
        '{}<text x="12" y="{}" transform="rotate(-90 12 {})" text-anchor="middle" '
        + FONT
        + ">{}</text>",
        lines,
        y0 - height // 2,
        y0 - height // 2,
        label,
    )


def jobs_per_minute(minutes: Sequence[Minute]) -> SafeString:
    """Stacked bars: jobs finished each minute of the last hour, by outcome."""
    width, height, left, bottom, top_pad = 720, 200, 48, 34, 12
    plot_h = height - bottom - top_pad
    y0 = height - bottom
    step = (width - left - 8) / max(1, len(minutes))
    top = nice_ceiling(max((m.total for m in minutes), default=0))
    bars = []
    for i, m in enumerate(minutes):
        x = left + i * step
        base: float = y0
        for n, colour, what in (
            (m.succeeded, SUCCEEDED, "succeeded"),
            (m.failed, FAILED, "failed"),
            (m.cancelled, CANCELLED, "cancelled"),
        ):
            if not n:
                continue
            h = plot_h * n / top
            bars.append(
                format_html(
                    '<rect x="{}" y="{}" width="{}" height="{}" fill="{}">'
                    "<title>{} UTC: {} {}</title></rect>",
                    _n(x + 1),
                    _n(base - h),
                    _n(max(step - 2, 1)),
                    _n(h),
                    colour,
                    f"{m.at:%H:%M}",
                    n,
                    what,
                )
            )
            base -= h
    x_ticks = format_html_join(
        "",
        '<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="#888"/>'
        '<text x="{}" y="{}" text-anchor="middle" ' + FONT + ">{}</text>",
        (
            (x, x, y0, y0 + 4, x, y0 + 16, f"{m.at:%H:%M}")
            for i, m in enumerate(minutes)
            if i % 10 == 0 or i == len(minutes) - 1
            for x in [_n(left + i * step)]
        ),
    )
    return format_html(
        '<svg class="overview-chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'aria-label="jobs finished per minute, last hour">'
        "{axis}{bars}"
        '<line x1="{left}" x2="{right}" y1="{y0}" y2="{y0}" stroke="#888"/>'
        "{x_ticks}"
        '<text x="{cx}" y="{xl}" text-anchor="middle" ' + FONT + ">minute finished (UTC)</text>"
        "{legend}</svg>",
        w=width,
        h=height,
        axis=_y_axis(
            top=top, left=left, right=width - 8, y0=y0, height=plot_h, label="jobs / min", fmt=".0f"
        ),
        bars=SafeString("".join(bars)),
        left=left,
        right=width - 8,
        y0=y0,
        x_ticks=x_ticks,
        cx=(left + width) // 2,
        xl=height - 2,
        legend=_legend(
            [("succeeded", SUCCEEDED), ("failed", FAILED), ("cancelled", CANCELLED)], x=left + 8
        ),
    )


def _legend(items: Sequence[tuple[str, str]], *, x: int) -> SafeString:
    return format_html_join(
        "",
        '<rect x="{}" y="2" width="10" height="10" fill="{}"/>'
        '<text x="{}" y="11" ' + FONT + ">{}</text>",
        ((x + i * 90, colour, x + i * 90 + 14, name) for i, (name, colour) in enumerate(items)),
    )


def latency_by_priority(rows: Sequence[Latency]) -> SafeString:
    """Grouped bars: p50 and p95 of queue wait, first audio and total, per priority."""
    width, height, left, bottom, top_pad = 720, 220, 48, 40, 18
    plot_h = height - bottom - top_pad
    y0 = height - bottom
    metrics = (("queue wait", "queue_wait"), ("first audio", "first_audio"), ("total", "total"))
    values = [v for r in rows for _, attr in metrics for v in getattr(r, attr) if v is not None]
    top = nice_ceiling(max(values, default=0.0))
    group_w = (width - left - 8) / max(1, len(rows))
    bar_w = group_w / (len(metrics) * 2 + 2)
    parts = []
    for g, row in enumerate(rows):
        gx = left + g * group_w + bar_w
        for m, (label, attr) in enumerate(metrics):
            for k, (value, colour, which) in enumerate(
                zip(getattr(row, attr), (P50, P95), ("p50", "p95"), strict=True)
            ):
                if value is None:
                    continue
                h = plot_h * value / top
                parts.append(
                    format_html(
                        '<rect x="{}" y="{}" width="{}" height="{}" fill="{}">'
                        "<title>{}: {} {} {} s</title></rect>",
                        _n(gx + (m * 2 + k) * bar_w),
                        _n(y0 - h),
                        _n(bar_w - 1),
                        _n(h),
                        colour,
                        row.priority,
                        label,
                        which,
                        f"{value:.3f}",
                    )
                )
            parts.append(
                format_html(
                    '<text x="{}" y="{}" text-anchor="middle" font-size="9" '
                    'font-family="sans-serif" fill="currentColor">{}</text>',
                    _n(gx + (m * 2 + 1) * bar_w),
                    y0 + 12,
                    label,
                )
            )
        parts.append(
            format_html(
                '<text x="{}" y="{}" text-anchor="middle" font-weight="bold" '
                + FONT
                + ">{} ({} jobs)</text>",
                _n(gx + len(metrics) * bar_w),
                y0 + 28,
                row.priority,
                row.jobs,
            )
        )
    return format_html(
        '<svg class="overview-chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        'aria-label="latency by priority, last hour">'
        "{axis}{parts}"
        '<line x1="{left}" x2="{right}" y1="{y0}" y2="{y0}" stroke="#888"/>{legend}</svg>',
        w=width,
        h=height,
        axis=_y_axis(
            top=top, left=left, right=width - 8, y0=y0, height=plot_h, label="seconds", fmt=".3g"
        ),
        parts=SafeString("".join(parts)),
        left=left,
        right=width - 8,
        y0=y0,
        legend=_legend([("p50", P50), ("p95", P95)], x=left + 8),
    )
