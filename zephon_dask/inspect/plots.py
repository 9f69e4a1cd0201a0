"""matplotlib views of :class:`PipelineStats`: the mixture over steps, packing efficiency. Pure.

matplotlib is imported when a plot is drawn; without it the functions raise
:class:`MissingDependencyError` naming the install command.
"""

from __future__ import annotations

from ..errors import MissingDependencyError


def _axes(ax):
    """``ax``, or new axes from matplotlib (imported here)."""
    if ax is not None:
        return ax
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError(
            "plots need matplotlib: pip install matplotlib (it comes with zephon_dask[dev])"
        ) from None
    return plt.subplots(figsize=(7, 3))[1]


def plot_mixture(stats, ax=None):
    """Stacked share per dataset at each global step, with the target as dashes, in the mixture's
    ``weight_by`` unit (real tokens, or samples counted where a record's first token lands)."""
    ax = _axes(ax)
    unit = "tokens" if stats.weight_by == "tokens" else "samples"
    steps = [h["global_step"] for h in stats.history]
    names = [m["dataset"] for m in stats.mixture]
    counts = [h[f"dataset_{unit}"] for h in stats.history]
    totals = [max(sum(c.values()), 1) for c in counts]
    shares = [[c[n] / t for c, t in zip(counts, totals, strict=True)] for n in names]
    ax.stackplot(steps, shares, labels=names, alpha=0.8)
    level = 0.0
    for m in stats.mixture[:-1]:
        level += m["target"]
        ax.axhline(level, color="black", linestyle="--", linewidth=0.8)
    title = f"realized mixture per step (dashes: target {unit[:-1]} weights)"
    ensure = getattr(stats, "ensure_mixture", None)
    if ensure and all(m["target"] is not None for m in ensure):
        level = 0.0
        for m in ensure[:-1]:
            level += m["target"]
            ax.axhline(level, color="tab:red", linestyle=":", linewidth=1.2)
        delivered = " / ".join(f"{m['dataset']} {m['delivered_share'] or 0:.3f}" for m in ensure)
        dropped = sum(m["dropped"] for m in ensure)
        title += f"\nensure_mixture (dots: its target): delivered {delivered}, {dropped:,} samples dropped"
    ax.set(xlabel="global step", ylabel=f"share of {'real tokens' if unit == 'tokens' else 'samples'}", ylim=(0, 1))
    ax.set_title(title, fontsize=9 if ensure else None)
    ax.legend(loc="upper right", fontsize=8)
    return ax


def plot_packing(stats, ax=None):
    """Real tokens over batch slots per global step (1.0 = no padding)."""
    ax = _axes(ax)
    steps = [h["global_step"] for h in stats.history]
    ax.plot(steps, [h["tokens"] / h["slots"] if h["slots"] else 0 for h in stats.history], marker=".")
    ax.set(xlabel="global step", ylabel="real tokens / slots", ylim=(0, 1.05), title="padding efficiency per step")
    return ax
