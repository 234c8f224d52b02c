"""Training curves (MLM and NSP loss and accuracy, train vs held-out) as a PNG."""

from __future__ import annotations

from pathlib import Path


def plot_metrics(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    train = [r for r in history if "loss" in r]
    evals = [r for r in history if "eval" in r]
    panels = [("mlm_loss", "MLM loss"), ("nsp_loss", "NSP loss"), ("mlm_accuracy", "masked-token accuracy"),
              ("nsp_accuracy", "NSP accuracy")]
    figure, axes = plt.subplots(2, 2, figsize=(10, 7))
    for axis, (key, title) in zip(axes.flat, panels):
        axis.plot([r["step"] for r in train], [r[key] for r in train], label="train", linewidth=1)
        axis.plot([r["step"] for r in evals], [r["eval"][key] for r in evals], "o-", label="held-out")
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    figure.savefig(tmp, dpi=90)
    plt.close(figure)
    tmp.replace(path)
