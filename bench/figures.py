"""matplotlib helpers every figure of bench/ shares (off screen, one way to save).

Their own module so that bench/plots.py (the macro run's figures, which draws the
scaling model's too) and bench/scaling.py (which measures that model) both use
them without importing each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot off screen (the Agg backend: benchmarks run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, out: Path) -> Path:
    """Lay the figure out, save it as a PNG (100 dpi) and free it; ``out``."""
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    pyplot().close(fig)
    return out
