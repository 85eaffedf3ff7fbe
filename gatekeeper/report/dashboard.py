"""The stats dashboard: one self-contained HTML page with inline SVG charts.

No scripts, fonts, stylesheets or images from elsewhere: the page opens anywhere, and every
figure is in its text (charts carry their numbers as labels too).
"""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper import __version__
from gatekeeper.receipt.models import DECISIONS
from gatekeeper.report.stats import FIGURES, Stats
from gatekeeper.report.templating import environment

CHART_WIDTH = 540
BAR_HEIGHT = 18
LABEL_WIDTH = 200


@dataclass(frozen=True)
class Segment:
    """One rectangle of a bar chart, with the number it stands for."""

    x: float
    y: float
    width: float
    height: float
    css: str  # class: the series it belongs to
    value: int
    title: str


@dataclass(frozen=True)
class Row:
    """One labelled bar (horizontal charts) or column (the runs over time)."""

    label: str
    total: int
    segments: list[Segment]
    y: float  # of the label (horizontal) / x (columns)


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    width: float
    height: float
    rows: list[Row]
    legend: list[tuple[str, str]]  # (css class, name)
    horizontal: bool = True


def _horizontal(id: str, title: str, items: list[tuple[str, dict[str, int]]],
                series: list[str]) -> Chart:  # fmt: skip
    """One bar per item, split into series (stacked left to right)."""
    peak = max((sum(parts.values()) for _, parts in items), default=0) or 1
    scale = (CHART_WIDTH - LABEL_WIDTH - 50) / peak
    rows = []
    for i, (label, parts) in enumerate(items):
        y = 8 + i * (BAR_HEIGHT + 8)
        x = float(LABEL_WIDTH)
        segments = []
        for name in series:
            value = parts.get(name, 0)
            if value:
                width = max(value * scale, 2.0)
                segments.append(Segment(x, y, width, BAR_HEIGHT, f"s-{name}", value,
                                        f"{label}: {value} {name}"))  # fmt: skip
                x += width
        rows.append(Row(label, sum(parts.values()), segments, y))
    height = 16 + len(items) * (BAR_HEIGHT + 8)
    legend = [(f"s-{name}", name) for name in series if len(series) > 1]
    return Chart(id, title, CHART_WIDTH, max(height, 40), rows, legend)


def _runs_over_time(stats: Stats) -> Chart:
    """A column per day: accepted, discarded and other runs, stacked."""
    days = stats.by_day
    peak = max((d["runs"] for d in days), default=0) or 1
    plot = 180.0
    step = max(min((CHART_WIDTH - 60) / max(len(days), 1), 90.0), 24.0)
    rows = []
    for i, day in enumerate(days):
        other = day["runs"] - day["accepted_runs"] - day["discarded_runs"]
        x = 40 + i * step
        top = 20 + plot
        segments = []
        for css, name, value in (("s-accepted", "accepted", day["accepted_runs"]),
                                 ("s-discarded", "discarded", day["discarded_runs"]),
                                 ("s-other", "other", max(other, 0))):  # fmt: skip
            if value:
                h = value * plot / peak
                top -= h
                segments.append(Segment(x, top, step * 0.6, h, css, value,
                                        f"{day['day']}: {value} {name}"))  # fmt: skip
        rows.append(Row(str(day["day"]), int(day["runs"]), segments, x))
    width = max(CHART_WIDTH, 60 + len(days) * step)
    legend = [("s-accepted", "accepted"), ("s-discarded", "discarded"), ("s-other", "other")]
    return Chart("runs-over-time", "Runs accepted and discarded, by day", width, 240, rows,
                 legend, horizontal=False)  # fmt: skip


def charts(stats: Stats) -> list[Chart]:
    by_kind = stats.escalations_by_kind()
    denied = stats.most_denied()
    return [
        _runs_over_time(stats),
        _horizontal("escalations", "Escalations by kind and decision",
                    list(by_kind.items()), list(DECISIONS)),
        _horizontal("denied-commands", "Most denied commands",
                    [(v, {"denied": n}) for v, n in denied["commands"]], ["denied"]),
        _horizontal("denied-paths", "Most denied paths",
                    [(v, {"denied": n}) for v, n in denied["paths"]], ["denied"]),
        _horizontal("denied-destinations", "Most denied destinations",
                    [(v, {"denied": n}) for v, n in denied["destinations"]], ["denied"]),
    ]  # fmt: skip


def render_dashboard(stats: Stats) -> str:
    """The whole page."""
    return (
        environment(markup=True)
        .get_template("dashboard.html.j2")
        .render(
            stats=stats,
            totals=stats.totals,
            figures=FIGURES,
            charts=charts(stats),
            version=__version__,
        )  # fmt: skip
    )
