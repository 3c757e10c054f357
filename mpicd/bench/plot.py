"""The projection as a plot (projected round time against N, one panel per model)."""

from __future__ import annotations


def plot(r: dict, path: str) -> bool:
    """Projected round time against N, one panel per model; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    pr = r["projection"]
    fig, axes = plt.subplots(1, len(pr["models"]), figsize=(11, 4.2), squeeze=False)
    for ax, (model, m) in zip(axes[0], pr["models"].items()):
        for name, a in m["algorithms"].items():
            (line,) = ax.plot(pr["ranks"], a["round_seconds"], marker="o", ms=3, label=name)
            ax.plot(pr["ranks"], a["comm_seconds"], ls=":", color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks N")
        ax.set_ylabel("seconds per round (dotted: exchange only)")
        ax.set_title(f"{model}: P = {m['P']:,}, compute {m['compute_seconds']:.2g} s")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
