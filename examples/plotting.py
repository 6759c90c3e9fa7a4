"""The Python examples' plotting plumbing: matplotlib's pyplot on the Agg backend
when matplotlib is importable, and the loss-curve panel their PNGs share."""


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display), or None
    (and a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written (pip install matplotlib)")
        return None
    return plt


def loss_panel(ax, losses, title: str = "loss", ylabel: str = "MSE loss") -> None:
    """The loss curve on a log scale, one point per step, on the axes ``ax``."""
    ax.semilogy(range(len(losses)), losses)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
