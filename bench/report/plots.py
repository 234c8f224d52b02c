"""The report's plots, drawn from bench.report's JSON with matplotlib (no display needed): one function per
figure, each writing a PNG."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STYLE = {"service:int8": ("#1f6feb", "-", "o"), "service:float32": ("#1f6feb", "--", "s"),
         "infinity:optimum-int8": ("#d97706", "-", "o"), "infinity:torch-float32": ("#d97706", "--", "s"),
         "naive": ("#6b7280", ":", "^")}
LABELS = {"service:int8": "ours, int8", "service:float32": "ours, float32", "infinity:optimum-int8":
          "Infinity, ONNX int8", "infinity:torch-float32": "Infinity, torch float32",
          "naive": "transformers, one forward per request"}


def _save(figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _log2_axis(axes, values) -> None:
    """A base-2 log x axis ticked at exactly the values measured."""
    ticks = sorted(values)
    axes.set_xscale("log", base=2)
    axes.set_xticks(ticks, [str(t) for t in ticks])


def _finish(figure, axes, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    """Labels, grid and legend of a line plot, then saved."""
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    _save(figure, path)


def throughput(report: dict, path: Path) -> None:
    figure, axes = plt.subplots(figsize=(7, 4.2))
    systems = dict.fromkeys(r["system"] for r in report["concurrency"])
    for system in systems:
        rows = [r for r in report["concurrency"] if r["system"] == system]
        color, line, marker = STYLE.get(system, ("black", "-", "x"))
        axes.plot([r["concurrency"] for r in rows], [r["seq_s"] for r in rows], line, marker=marker, color=color,
                  label=LABELS.get(system, system))
    _log2_axis(axes, {r["concurrency"] for r in report["concurrency"]})
    for r in report["headline"]:
        if r["model"] == report["sweep_model"] and r["system"] == "ours" and r["precision"] in ("int8", "float32"):
            axes.axhline(r["limit_seq_s"], color="#1f6feb", alpha=0.35, linewidth=1)
            axes.text(0.01, r["limit_seq_s"], f"in-process limit, {r['precision']}", fontsize=7, color="#1f6feb",
                      va="bottom", transform=axes.get_yaxis_transform())
    _finish(figure, axes, path, "concurrent clients (one sentence per request)", "sentences / s",
            f"Throughput vs concurrency, {report['sweep_model']}, {report['machine']['cores']} CPU cores")


def latency(report: dict, path: Path) -> None:
    data = report["latency_vs_load"]
    steps = data["steps"]
    figure, axes = plt.subplots(figsize=(7, 4.2))
    offered = [s["offered_rps"] for s in steps]
    for key, style in (("p50_ms", "-"), ("p95_ms", "--"), ("p99_ms", ":")):
        points = [(o, s[key]) for o, s in zip(offered, steps) if s[key] is not None]
        axes.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", color="#1f6feb",
                  label=key.split("_")[0] + " (answered)")
    axes.set_yscale("log")
    axes.set_xlabel("offered load, requests / s (open loop)")
    axes.set_ylabel("latency, ms")
    refused = axes.twinx()
    refused.bar(offered, [100 * s["refused_429"] for s in steps], width=max(offered) * 0.03, color="#dc2626",
                alpha=0.35, label="429 share")
    refused.set_ylabel("refused with 429, %")
    refused.set_ylim(0, 100)
    axes.axvline(data["capacity_rps"], color="gray", linestyle="-.", linewidth=1)
    axes.annotate("closed-loop capacity", (data["capacity_rps"], axes.get_ylim()[0]), fontsize=7, rotation=90,
                  va="bottom", ha="right", color="gray")
    onset = onset_of_429s(steps)
    if onset:
        axes.axvline(onset, color="#dc2626", linewidth=1)
        axes.annotate("429s begin", (onset, axes.get_ylim()[1]), fontsize=7, color="#dc2626", va="top", ha="left")
    axes.set_title(f"Latency vs offered load, {report['sweep_model']} {data['precision']}")
    axes.grid(alpha=0.3)
    handles = axes.get_legend_handles_labels()[0] + refused.get_legend_handles_labels()[0]
    labels = axes.get_legend_handles_labels()[1] + refused.get_legend_handles_labels()[1]
    axes.legend(handles, labels, fontsize=8, loc="upper left")
    _save(figure, path)


def precision(report: dict, path: Path) -> None:
    figure, axes = plt.subplots(figsize=(7, 4.2))
    for r in report["precision"]:
        ours = r["variant"].startswith("ours")
        axes.scatter(r["cosine_mean"], r["seq_s"], color="#1f6feb" if ours else "#6b7280", marker="o" if ours else "s")
        axes.annotate(r["variant"].replace(" (reference)", ""), (r["cosine_mean"], r["seq_s"]), fontsize=7,
                      xytext=(4, 4), textcoords="offset points")
    axes.set_xlabel("mean cosine of the sentence embedding to float32 transformers")
    axes.set_ylabel("sentences / s (in-process)")
    axes.set_title(f"Precision trade-off, {report['sweep_model']}")
    axes.grid(alpha=0.3)
    _save(figure, path)


def length(report: dict, path: Path) -> None:
    figure, axes = plt.subplots(figsize=(7, 4.2))
    systems = dict.fromkeys(r["system"] for r in report["length"])
    for system in systems:
        rows = [r for r in report["length"] if r["system"] == system]
        color = "#1f6feb" if system.startswith("ours") else "#6b7280"
        axes.plot([r["tokens"] for r in rows], [r["us_per_token"] for r in rows], "-" if "int8" in system else "--",
                  marker="o", color=color, label=system)
    _log2_axis(axes, {r["tokens"] for r in report["length"]})
    _finish(figure, axes, path, "input length, tokens", "µs per token (lower is better)",
            f"Cost vs input length, {report['sweep_model']} (attention grows with length²)")


def draw_all(report: dict, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    for name, draw in (("throughput", throughput), ("latency", latency), ("precision", precision), ("length", length)):
        path = folder / f"bench-{name}.png"
        draw(report, path)
        made.append(path)
    return made


def onset_of_429s(steps: list[dict], share: float = 0.01) -> float | None:
    """The lowest offered load from which on every step refused at least `share` with 429 (a lone Poisson
    burst below it can fill a short queue for a moment; that is not where overload begins)."""
    onset = None
    for step in sorted(steps, key=lambda s: s["offered_rps"]):
        if step["refused_429"] >= share:
            onset = onset or step["offered_rps"]
        else:
            onset = None
    return onset
