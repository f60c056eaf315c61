"""PNG timeline of a fault run's history: operations per second, faults shaded,
latency.

    python -m tests.faults.plot history.json timeline.png
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.faults.history import load

fault_colors = {"halves": "#f4a6a6", "isolate": "#f7c98b", "ring": "#c9b3f2",
                "kill9": "#9fc5e8", "pause": "#b6d7a8", "kill-worker": "#d5d5d5"}


def _per_second(times: list[float], end_s: int) -> list[int]:
    counts = [0] * (end_s + 1)
    for t in times:
        if 0 <= t <= end_s:
            counts[int(t)] += 1
    return counts


def plot(data: dict[str, Any], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ops = data["ops"]
    end_s = int(max((op["t1"] for op in ops), default=1.0)) + 1
    fig, (ax, lat) = plt.subplots(2, 1, figsize=(14, 7), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 2]})
    series = [
        ("enqueue ok", [o["t1"] for o in ops if o["f"] == "enqueue" and o["type"] == "ok"], "C0"),
        ("enqueue fail", [o["t1"] for o in ops if o["f"] == "enqueue" and o["type"] == "fail"],
         "C3"),
        ("enqueue info", [o["t1"] for o in ops if o["f"] == "enqueue" and o["type"] == "info"],
         "C1"),
        ("jobs dequeued", [o["t1"] for o in ops if o["f"] == "dequeue" and o["type"] == "ok"
                           for _ in o["v"]], "C2"),
        ("ack ok", [o["t1"] for o in ops if o["f"] == "ack" and o["type"] == "ok"], "C4"),
    ]
    xs = list(range(end_s + 1))
    for label, times, color in series:
        ax.plot(xs, _per_second(times, end_s), label=label, color=color, lw=1)
    for a in (ax, lat):
        for f in data["faults"]:
            a.axvspan(f["t0"], f["t1"], color=fault_colors.get(f["kind"], "#eeeeee"), alpha=0.6,
                      lw=0)
    handles, labels = ax.get_legend_handles_labels()
    kinds = sorted({f["kind"] for f in data["faults"]})
    handles += [Patch(color=fault_colors.get(k, "#eeeeee"), alpha=0.6) for k in kinds]
    labels += kinds
    ax.legend(handles, labels, loc="upper right", fontsize=8, ncol=2)
    ax.set_ylabel("operations / s")
    checks = data.get("checks", {})
    r2, r0 = checks.get("r2", {}), checks.get("r0", {})
    ax.set_title(f"seed {data.get('seed')}: {checks.get('operations')} operations, "
                 f"{checks.get('faults')} faults, lost {len(r2.get('lost', []))}, "
                 f"duplicated {r2.get('duplicated')} (r2) / {r0.get('duplicated')} (r0), "
                 f"valid {checks.get('valid')}")
    for f_name, color in (("enqueue", "C0"), ("dequeue", "C2")):
        pts = [(o["t0"], (o["t1"] - o["t0"]) * 1000) for o in ops
               if o["f"] == f_name and o["p"] != "drain"]
        lat.scatter([p[0] for p in pts], [p[1] for p in pts], s=2, color=color,
                    label=f"{f_name} latency", alpha=0.5)
    lat.set_yscale("log")
    lat.set_ylabel("latency (ms)")
    lat.set_xlabel("seconds since the start of the workload")
    lat.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    plot(load(Path(sys.argv[1])), Path(sys.argv[2]))
