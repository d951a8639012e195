"""PNG plots of a bench run: tokens/s by mode and batch size, and ms/step against step index."""

from __future__ import annotations

from pathlib import Path
from typing import Any

INSTALL = 'pip install "fastdecode[bench]"  (or: pip install matplotlib)'


class PlotsUnavailable(Exception):
    pass


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable(f"matplotlib is not installed; install with: {INSTALL}") from None
    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def write_plots(report: dict[str, Any], out: Path) -> list[str]:
    """Write the plots next to the JSON file; returns their paths."""
    plt = _pyplot()
    rows = [r for r in report["rows"] if r.get("decode_tokens_per_s")]
    if not rows:
        return []
    title = f"{report['machine'].get('cpu_model', '')} / {report['machine'].get('gpu', report['machine']['device'])}"
    return [str(p) for p in (_tokens_per_s(plt, rows, out, title), _ms_per_step(plt, rows, out, title))]


def _label(r: dict[str, Any]) -> str:
    return r["name"] if r["engine"] in ("fastdecode", r["name"]) else f"{r['engine']}:{r['name']}"


def _tokens_per_s(plt, rows: list[dict[str, Any]], out: Path, title: str) -> Path:
    panels = sorted({(r["new_tokens"], r["prompt_tokens"]) for r in rows})
    batches = sorted({r["batch_size"] for r in rows})
    names = list(dict.fromkeys(_label(r) for r in rows))
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(6.0, 1.3 * len(names) + 2), 3.6 * len(panels)),
                             squeeze=False)
    width = 0.8 / len(batches)
    for ax, (n, p) in zip(axes[:, 0], panels):
        for j, b in enumerate(batches):
            values = {_label(r): r["decode_tokens_per_s"] for r in rows
                      if (r["new_tokens"], r["prompt_tokens"], r["batch_size"]) == (n, p, b)}
            xs = [i + (j - (len(batches) - 1) / 2) * width for i in range(len(names))]
            ax.bar(xs, [values.get(name, 0.0) for name in names], width, label=f"batch {b}")
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
        ax.set_ylabel("decode tokens/s (all sequences)")
        ax.set_title(f"{n} new tokens, {p}-token prompt", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    return _save(plt, fig, title, out / "tokens_per_s.png")


def _ms_per_step(plt, rows: list[dict[str, Any]], out: Path, title: str) -> Path:
    # The longest generation shows the trend best; the first prompt length keeps one line per mode.
    n = max(r["new_tokens"] for r in rows)
    p = min(r["prompt_tokens"] for r in rows if r["new_tokens"] == n)
    chosen = [r for r in rows if (r["new_tokens"], r["prompt_tokens"]) == (n, p) and r.get("step_ms")]
    batches = sorted({r["batch_size"] for r in chosen}) or [None]
    fig, axes = plt.subplots(1, len(batches), figsize=(6.0 * len(batches), 4.0), squeeze=False)
    for ax, b in zip(axes[0], batches):
        for r in (r for r in chosen if r["batch_size"] == b):
            ax.plot(range(1, len(r["step_ms"]) + 1), r["step_ms"], label=_label(r), linewidth=1)
        ax.set_xlabel("decode step")
        ax.set_ylabel("ms per step (median over runs)")
        ax.set_title(f"batch {b}, {n} new tokens, {p}-token prompt", fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(plt, fig, title, out / "ms_per_step.png")


def _save(plt, fig, title: str, path: Path) -> Path:
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
