#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""docs/dashboard.png: the Grafana dashboard's panels (deploy/grafana/mergewatch.json), drawn with matplotlib
from the real Prometheus during a real merge collapse on a loop device. Grafana is not packaged by Debian, so this
is a rendering of the panels' own queries, not a Grafana screenshot.

The run (tests/deploy/dashboard_run.py, the same as the dashboard test): a loop device with mq-deadline and
nomerges=2 read sequentially in 4 KiB direct batches of 64 by fio, watched by mergewatchd; after the collapse has
been raised for a while, nomerges goes back to 0 while fio keeps reading, so the picture shows the collapse and
the recovery. The stacking table comes from the second daemon reading the LVM-snapshot-on-NVMe sysfs fixture. The
kernel cohort panels compare the host's kernel with a second cohort: the same daemon scraped again as another
host whose kernel label Prometheus relabels (tests/deploy/dashboard_run.py), so their lines coincide.

    make dashboard-picture            # as root; about two minutes
"""
import argparse
import os
import sys
import time

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "deploy"))
from dashboard_run import COHORT_JOIN, DashboardRun, panel_targets, substitute  # noqa: E402

STACKING = ("mergewatch_device_holder_info", "mergewatch_device_info")


def legend(fmt, metric):
    out = fmt
    for k, v in metric.items():
        out = out.replace("{{%s}}" % k, v)
    return out.replace("{{upper}}", "-").replace("{{instance}}", "").strip() or metric.get("__name__", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--collapsed-seconds", type=int, default=60)
    ap.add_argument("--healthy-seconds", type=int, default=45)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("dashboard_picture: needs root (BPF, loop devices)")

    run = DashboardRun(os.path.abspath(args.daemon))
    try:
        run.start()
        run.wait_collapse()
        time.sleep(args.collapsed_seconds)
        run.dev.set_queue(nomerges=0)
        fixed_at = time.time()
        time.sleep(args.healthy_seconds)
        end = time.time()
        start = run.start_time
        panels = {}
        for title, ref, expr, fmt, panel in panel_targets():
            stacked = any(m in expr for m in STACKING)
            # The cohort panels compare hosts: the host picker at its default (All).
            instance = run.stacked_instance if stacked else ".+" if COHORT_JOIN in expr else run.loop_instance
            q = substitute(expr, instance, ".+" if stacked else run.dev.name)
            if panel["type"] == "table":
                # Instant queries, as Grafana's tables: taken during the collapse, before nomerges=0.
                rows = run.api("query", query=q, time=fixed_at - 3)["result"]
            else:
                rows = run.query_range(q, start, end, 2)
            panels.setdefault(title, (panel, []))[1].append((fmt, rows))
        draw(panels, start, fixed_at, run.dev.name, args.out)
    finally:
        run.stop()
    print(f"dashboard_picture: wrote {args.out}")


def draw(panels, start, fixed_at, dev, out):
    order = [t for t in panels]
    fig, axes = plt.subplots(5, 3, figsize=(21, 22.5))
    axes = [a for row in axes for a in row]
    fig.suptitle(f"mergewatch dashboard panels, queried from Prometheus: {dev} with nomerges=2 (collapse), "
                 f"then nomerges=0 at the dashed line (matplotlib rendering of the Grafana panels' queries)",
                 fontsize=13)
    for ax, title in zip(axes, order):
        panel, series = panels[title]
        ax.set_title(title, fontsize=11, loc="left")
        if panel["type"] == "table":
            ax.axis("off")
            cells = []
            for _, rows in series:
                for r in rows:
                    m = {k: v for k, v in r["metric"].items() if k not in ("job", "instance") and v}
                    cells.append([m.pop("__name__", ""), " ".join(f"{k}={v}" for k, v in sorted(m.items())),
                                  r["value"][1]])
            cells = cells[:14] or [["(no data)", "", ""]]
            ax.set_title(f"{title} (during the collapse)", fontsize=11, loc="left")
            t = ax.table(cellText=cells, colLabels=["metric", "labels", "value"], loc="upper left",
                         cellLoc="left", colWidths=[0.34, 0.6, 0.06])
            t.auto_set_font_size(False)
            t.set_fontsize(7)
            continue
        if panel["type"] == "heatmap":
            fmt, rows = series[0]
            buckets = sorted(((float(r["metric"]["le"]), r) for r in rows), key=lambda x: x[0])
            times = [float(v[0]) - start for v in buckets[0][1]["values"]] if buckets else []
            grid, prev = [], None
            for le, r in buckets:  # cumulative -> per bucket
                vals = [float(v[1]) for v in r["values"]]
                grid.append([a - b for a, b in zip(vals, prev)] if prev else vals)
                prev = vals
            labels = [("+Inf" if le == float("inf") else f"{int(le) // 1024} KiB" if le >= 1024 else f"{int(le)} B")
                      for le, _ in buckets]
            if grid:
                ax.imshow(grid, aspect="auto", origin="lower", cmap="Oranges", interpolation="nearest",
                          extent=[times[0], times[-1], -0.5, len(labels) - 0.5])
                ax.set_yticks(range(len(labels)))
                ax.set_yticklabels(labels, fontsize=6)
            ax.axvline(fixed_at - start, color="k", ls="--")
            ax.set_xlabel("seconds")
            continue
        right = None
        for fmt, rows in series:
            for r in rows:
                xs = [float(v[0]) - start for v in r["values"]]
                ys = [float(v[1]) for v in r["values"]]
                name = legend(fmt, r["metric"])
                target = ax
                if "bytes" in name and "Collapse evidence: rates" in title:
                    right = right or ax.twinx()
                    target = right
                target.plot(xs, ys, label=name)
        ax.axvline(fixed_at - start, color="k", ls="--")
        ax.set_xlabel("seconds")
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        ax.set_ylabel(unit)
        handles, labels = ax.get_legend_handles_labels()
        if right:
            h2, l2 = right.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
            right.set_ylabel("bytes")
        if handles:
            ax.legend(handles, labels, fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "no data (needs I/O through a dm/md device)", ha="center", transform=ax.transAxes)
    for ax in axes[len(order):]:
        ax.axis("off")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=70)


if __name__ == "__main__":
    main()
