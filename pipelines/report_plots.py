"""Pretraining curves as PNG files, from the rows of the pretrain stage's `metrics.jsonl`.

Series are picked by name, so any metric the training loop logs lands on the right panel:
losses, accuracies (MLM/NSP), the learning rate, and throughput (anything `*per_s*`/`throughput`).
Training and evaluation rows of the same metric share a panel.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.atomic import atomic_path


def _is_lr(key: str) -> bool:
    leaf = key.rsplit("/", 1)[-1]
    return leaf in ("lr", "learning_rate") or leaf.startswith("lr_")


def _is_throughput(key: str) -> bool:
    return any(s in key for s in ("per_s", "per_sec", "throughput", "/s"))


def _is_loss(key: str) -> bool:
    return "loss" in key and "scale" not in key and not _is_throughput(key)


# legend text of the metrics the training loop logs (others keep their key)
LABELS = {
    "loss": "training loss (MLM + NSP)",
    "mlm_loss": "training MLM loss",
    "nsp_loss": "training NSP loss",
    "val_mlm_loss": "held-out MLM loss",
    "val_nsp_loss": "held-out NSP loss",
    "mlm_acc": "training MLM accuracy",
    "nsp_acc": "training NSP accuracy",
    "val_mlm_acc": "held-out MLM accuracy",
    "val_nsp_acc": "held-out NSP accuracy",
    "lr": "learning rate",
    "tokens_per_s": "tokens/s (all ranks, no padding)",
    "samples_per_s": "sequences/s (all ranks)",
}
# panel -> (baseline key of training.evaluate.MlmBaselines, legend text): what a model that ignores
# the context scores on the held-out examples, drawn as a dashed line
BASELINES = {
    "loss": ("unigram_entropy", "no context, masked-LM losses: unigram entropy"),
    "accuracy": ("most_frequent_token_acc", "no context, masked-LM accuracy: most frequent token"),
}

# (file stem, title, y label, which keys)
PANELS: list[tuple[str, str, str, Callable[[str], bool]]] = [
    ("loss", "Pretraining loss", "loss (nats)", _is_loss),
    (
        "accuracy",
        "Masked-LM (MLM) and next-sentence (NSP) accuracy",
        "accuracy (fraction: 0.12 = 12%)",  # the page states accuracies in percent
        lambda k: "acc" in k,
    ),
    ("lr", "Learning rate", "lr", _is_lr),
    ("throughput", "Throughput", "per second", _is_throughput),
]


def series(
    rows: list[dict[str, Any]], match: Callable[[str], bool]
) -> dict[str, tuple[list[float], list[float]]]:
    """key → (steps, values) for every numeric metric whose name matches."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for row in rows:
        step = row.get("step")
        if step is None:
            continue
        for key, value in row.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if value != value:  # NaN: leave a gap, do not break the axis
                continue
            if match(key):
                xs, ys = out.setdefault(key, ([], []))
                xs.append(float(step))
                ys.append(float(value))
    return out


def plot_curves(
    rows: list[dict[str, Any]], out_dir: Path, baselines: dict[str, float] | None = None
) -> dict[str, Path]:
    """One PNG per panel that has data; returns {stem: path}. `baselines` (the held-out examples'
    context-free scores, `training.evaluate.MlmBaselines`) are drawn where they apply."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: dict[str, Path] = {}
    for stem, title, ylabel, match in PANELS:
        data = series(rows, match)
        if stem == "throughput" and any("tokens" in k for k in data):
            data = {k: v for k, v in data.items() if "tokens" in k}  # one unit per axis
            ylabel = "tokens / s"
        if not data:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
        for key in sorted(data):
            xs, ys = data[key]
            style = "o-" if len(xs) < 15 else "-"
            ax.plot(xs, ys, style, label=LABELS.get(key, key), markersize=3, linewidth=1.4)
        base_key, base_label = BASELINES.get(stem, (None, None))
        level = (baselines or {}).get(base_key) if base_key else None
        if level is not None and level == level:
            ax.axhline(level, color="0.35", linestyle="--", linewidth=1.2, label=base_label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if stem == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png")
        plt.close(fig)
        written[stem] = path
    return written
