"""A speed check's figures against the ceilings measured in the same run, as a PNG (matplotlib).

The speed checks record, per test, what they achieved and what the machine could do (grader/speed.py):
bytes moved per second against the device's copy bandwidth (``gbps`` / ``copy_gbps``), FLOP/s against a
large bf16 matmul (``tflops`` or ``student_tflops`` / ``matmul_tflops``), library baselines (other
``*_gbps`` / ``*_tflops`` figures), and the metric the check is scored on with its ``bar`` and ``floor``.
Each kind present gets a panel: achieved value per test, the measured roof as a line, baselines as marks.
When a test reports both FLOP/s and bytes/s, a classic roofline (log-log, attainable FLOP/s against
arithmetic intensity, under the two measured roofs) shows where it sits.
"""

from __future__ import annotations

import base64
import io
import re
from dataclasses import dataclass, field

ACHIEVED_BANDWIDTH = ("gbps",)
ACHIEVED_COMPUTE = ("tflops", "student_tflops")
CEILING_BANDWIDTH = "copy_gbps"
CEILING_COMPUTE = "matmul_tflops"


@dataclass
class Panel:
    title: str
    unit: str
    labels: list[str] = field(default_factory=list)
    achieved: list[float] = field(default_factory=list)
    baselines: list[dict[str, float]] = field(default_factory=list)
    roof: float | None = None
    roof_label: str = ""
    marks: dict[str, float] = field(default_factory=dict)  # vertical lines (bar, floor)


def _label(name: str) -> str:
    match = re.search(r"\[(.*)\]$", name)
    return match.group(1) if match else name


def _first(metrics: dict, keys: tuple[str, ...]) -> float | None:
    return next((metrics[k] for k in keys if k in metrics), None)


def panels(check: dict, metric: str | None = None) -> list[Panel]:
    """The panels a check's recorded figures support (empty when it measured nothing)."""
    tests = [t for t in check["tests"] if t["metrics"]]
    bandwidth = Panel("memory traffic: achieved against the measured copy bandwidth", "GB/s")
    compute = Panel("compute: achieved against a large bf16 matmul", "TFLOP/s")
    scale = Panel(f"scored metric{': ' + metric if metric else ''} (full marks at the bar, none at the floor)", "")
    for test in tests:
        m = test["metrics"]
        label = _label(test["name"])
        achieved = _first(m, ACHIEVED_BANDWIDTH)
        if achieved is not None:
            bandwidth.labels.append(label)
            bandwidth.achieved.append(achieved)
            bandwidth.baselines.append({k: v for k, v in m.items() if k.endswith("_gbps") and k != CEILING_BANDWIDTH})
            bandwidth.roof = max(bandwidth.roof or 0.0, m.get(CEILING_BANDWIDTH, 0.0)) or None
        achieved = _first(m, ACHIEVED_COMPUTE)
        if achieved is not None:
            compute.labels.append(label)
            compute.achieved.append(achieved)
            compute.baselines.append({k: v for k, v in m.items() if k.endswith("_tflops")
                                      and k not in (CEILING_COMPUTE, *ACHIEVED_COMPUTE)})
            compute.roof = max(compute.roof or 0.0, m.get(CEILING_COMPUTE, 0.0)) or None
        if metric and metric in m:
            scale.labels.append(label)
            scale.achieved.append(m[metric])
            scale.baselines.append({})
            scale.marks = {k: m[k] for k in ("bar", "floor") if k in m}
    bandwidth.roof_label = "measured copy bandwidth"
    compute.roof_label = "measured bf16 matmul"
    return [p for p in (bandwidth, compute, scale) if p.labels]


def roofline_points(check: dict) -> tuple[float | None, float | None, list[tuple[str, float, float]]]:
    """(copy GB/s, matmul TFLOP/s, [(label, FLOP per byte, TFLOP/s)]) for tests that report both rates."""
    bw = max((t["metrics"].get(CEILING_BANDWIDTH, 0.0) for t in check["tests"]), default=0.0) or None
    peak = max((t["metrics"].get(CEILING_COMPUTE, 0.0) for t in check["tests"]), default=0.0) or None
    points = []
    for t in check["tests"]:
        gbps, tflops = _first(t["metrics"], ACHIEVED_BANDWIDTH), _first(t["metrics"], ACHIEVED_COMPUTE)
        if gbps and tflops:
            points.append((_label(t["name"]), tflops * 1e12 / (gbps * 1e9), tflops))
    return bw, peak, points


def plotting_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def roofline_png(check: dict, exercise_id: str, metric: str | None = None) -> bytes | None:
    """The check's figures as a PNG, or None when it recorded none (not measured: no CUDA, or failed)
    or matplotlib is not installed."""
    found = panels(check, metric)
    bw, peak, points = roofline_points(check)
    if not found and not points:
        return None
    from matplotlib.figure import (
        Figure,  # imported here: only a page with speed figures pays for it
    )

    heights = [0.9 + 0.32 * len(p.labels) for p in found] + ([3.2] if points and bw and peak else [])
    if not heights:
        return None
    fig = Figure(figsize=(8, 0.6 + sum(heights)), dpi=100, layout="constrained")
    axes = fig.subplots(len(heights), 1, squeeze=False, height_ratios=heights)[:, 0]
    fig.suptitle(f"{exercise_id} / {check['id']}", fontsize=11)
    for ax, panel in zip(axes, found):
        _bars(ax, panel)
    if points and bw and peak:
        _roofline(axes[-1], bw, peak, points)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def roofline_png_data_url(check: dict, exercise_id: str, metric: str | None = None) -> str | None:
    png = roofline_png(check, exercise_id, metric)
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii") if png else None


def _bars(ax, panel: Panel) -> None:
    rows = list(range(len(panel.labels)))
    ax.barh(rows, panel.achieved, color="#3b7dd8", label="achieved")
    ax.set_yticks(rows, panel.labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_title(panel.title, fontsize=9, loc="left")
    if panel.unit:
        ax.set_xlabel(panel.unit, fontsize=8)
    if panel.roof:
        ax.axvline(panel.roof, color="#c0392b", linestyle="--", zorder=3, label=f"{panel.roof_label} ({panel.roof:.4g})")
        for row, value in zip(rows, panel.achieved):
            ax.text(value, row, f" {value / panel.roof:.0%} of roof", va="center", fontsize=7)
    for name, value in panel.marks.items():
        ax.axvline(value, color="#7f8c8d" if name == "floor" else "#27ae60", linestyle=":", zorder=3, label=f"{name} ({value:g})")
    shown = set()
    for row, baselines in zip(rows, panel.baselines):
        for name, value in baselines.items():
            ax.plot([value], [row], marker="D", color="#e67e22", linestyle="none",
                    label=None if name in shown else name.replace("_", " "))
            shown.add(name)
    ax.legend(fontsize=7, loc="lower right")
    ax.tick_params(axis="x", labelsize=7)


def _roofline(ax, bw_gbps: float, peak_tflops: float, points: list[tuple[str, float, float]]) -> None:
    ridge = peak_tflops * 1e3 / bw_gbps  # FLOP per byte where the two roofs meet
    lo = min([ridge / 100, *(p[1] / 2 for p in points)])
    hi = max([ridge * 100, *(p[1] * 2 for p in points)])
    xs = [lo * (hi / lo) ** (k / 200) for k in range(201)]
    ax.plot(xs, [min(peak_tflops, x * bw_gbps / 1e3) for x in xs], color="#c0392b",
            label=f"roofs: {bw_gbps:.4g} GB/s copy, {peak_tflops:.4g} TFLOP/s bf16 matmul")
    for label, intensity, tflops in points:
        ax.plot([intensity], [tflops], marker="o", linestyle="none", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)", fontsize=8)
    ax.set_ylabel("TFLOP/s", fontsize=8)
    ax.set_title("roofline: where each measured run sits under the measured roofs", fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="lower right")
    ax.tick_params(labelsize=7)
