"""The plots of ``make bench-peers``: cycle throughput bars, add-to-delivery latency CDFs."""

from __future__ import annotations

from pathlib import Path

from bench.plots import pyplot, save_figure

PANELS = [("single", "cycle-1q", "single node, 1 queue"),
          ("single", "cycle-100q", "single node, 100 queues"),
          ("replicated", "cycle-1q", "3 nodes, 3 copies, 1 queue")]
CDF_RATES = [("paced-1000", "1,000 jobs/s"), ("paced-5000", "5,000 jobs/s")]
COLORS = {"disque-mp": "C3", "disque-mp-1w": "C8", "disque-c": "C1", "redis-list": "C4", "redis-streams": "C5",
          "beanstalkd": "C0", "rabbitmq": "C2", "nats": "C6"}  # one color per system


def throughput_plot(meds: dict[tuple[str, str, str], dict[str, float]], path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(PANELS), figsize=(13, 4))
    for ax, (setting, wl, title) in zip(axes, PANELS, strict=True):
        rows = [(k[2], m.get("jobs_per_s", 0.0)) for k, m in meds.items()
                if k[0] == setting and k[1] == wl]
        rows.sort(key=lambda r: -r[1])
        colors = ["C3" if s == "disque-mp" else "C0" for s, _ in rows]
        ax.bar([s for s, _ in rows], [v for _, v in rows], color=colors)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("jobs/s (add, take, ack)")
        ax.tick_params(axis="x", rotation=45, labelsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    return save_figure(fig, path)


def cdf_plot(samples: dict[str, list[int]], path: Path) -> Path:
    """Every round's samples of a (setting, rate, system) pooled into one curve."""
    plt = pyplot()
    pooled: dict[tuple[str, str, str], list[int]] = {}
    for key, lat in samples.items():
        setting, wl, system, _ = key.split("|")
        pooled.setdefault((setting, wl, system), []).extend(lat)
    fig, axes = plt.subplots(2, len(CDF_RATES), figsize=(11, 7), squeeze=False)
    for i, setting in enumerate(("single", "replicated")):
        for j, (wl, label) in enumerate(CDF_RATES):
            ax = axes[i][j]
            for (s, w, system), lat in sorted(pooled.items()):
                if s != setting or w != wl or not lat:
                    continue
                xs = sorted(v / 1e6 for v in lat)
                ys = [(k + 1) / len(xs) for k in range(len(xs))]
                ax.plot(xs, ys, label=system, color=COLORS.get(system),
                        lw=2.2 if system == "disque-mp" else 1.2)
            ax.set_xscale("log")
            ax.set_title(f"{setting}, {label}", fontsize=10)
            ax.set_xlabel("add to delivery, ms (log)")
            ax.set_ylabel("fraction of jobs")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    return save_figure(fig, path)
