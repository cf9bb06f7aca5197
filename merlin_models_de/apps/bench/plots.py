"""PNG plots of the bench's rows and of the capacity search (matplotlib, no display).

Each function returns one line saying what it wrote, or why it wrote nothing (matplotlib is
the ``bench`` extra; without it the JSON and markdown beside are the results).
"""

from __future__ import annotations

GIB = 2**30


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # files only: no display on a training host
    import matplotlib.pyplot as plt

    return plt


def bench_png(rows: list[dict], path: str, capacity: list[dict] | None = None) -> str:
    """Warm samples/s and the largest peak resident memory per rank of every bench row (and
    the capacity curve when a capacity search ran beside it)."""
    plt = _pyplot()
    if plt is None:
        return f"no plot ({path}): matplotlib is not installed (pip install .[bench])"
    panels = 3 if capacity else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5))
    labels = [f"{r['run']}\n{r['optimizer']}, {r['ranks']} rank(s)" for r in rows]
    axes[0].barh(labels, [r["warm_samples_per_second"] for r in rows], color="tab:blue")
    axes[0].set_xlabel("warm samples/s (median over repeats)")
    axes[1].barh(labels, [max(r["peak_rss_per_rank"]) / GIB for r in rows], color="tab:orange")
    axes[1].set_xlabel("peak resident memory per rank (GiB)")
    for ax in axes[:2]:
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=7)
    if capacity:
        _capacity_axes(axes[2], capacity)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"Plot: {path}"


def _capacity_axes(ax, rows: list[dict]) -> None:
    for i, row in enumerate(rows):
        ok = sorted((t for t in row["runs"] if t["ok"]), key=lambda t: t["scale"])
        color = f"C{i}"
        if ok:
            scales = [t["scale"] for t in ok]
            ax.plot(
                scales,
                [max(t["rank_peaks"]) / GIB for t in ok],
                "o-",
                color=color,
                label=f"{row['config']} measured",
            )
            ax.plot(
                scales,
                [max(t["predicted"]) / GIB for t in ok],
                "x--",
                color=color,
                label=f"{row['config']} predicted",
            )
        failed = [t for t in row["runs"] if not t["ok"]]
        if failed:
            ax.axvline(min(t["scale"] for t in failed), color=color, alpha=0.3, linestyle=":")
    ax.set_xlabel("Criteo table rows x scale (dotted: first that did not fit)")
    ax.set_ylabel("peak resident memory per rank (GiB)")
    ax.legend(fontsize=7)


def capacity_png(rows: list[dict], path: str) -> str:
    """Measured and predicted peak per rank against the table scale, per configuration."""
    plt = _pyplot()
    if plt is None:
        return f"no plot ({path}): matplotlib is not installed (pip install .[bench])"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _capacity_axes(ax, rows)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"Plot: {path}"
