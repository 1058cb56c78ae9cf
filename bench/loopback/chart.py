"""chart.png: throughput, latency, the proxies' peak memory, CPU per request (proxy, journal writer, PostgreSQL),
each round's throughput against the median, and p50 latency against the stored history."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.loopback.report import find_run
from bench.loopback.session import Row
from bench.loopback.targets import RECEIPTS_TARGETS, TARGETS

COLOURS = {"direct": "#7f7f7f", "mitmdump": "#1f77b4", "sqlite": "#2ca02c", "postgres": "#d62728", "postgres-2": "#9467bd"}
GROWTH_LINE_STYLES = ("-o", "--s", ":^", "-.d")

Value = Callable[[Row], float | None]


def chart(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    keys = [k for k in TARGETS if any(r["target"] == k for r in runs)]
    fig, axes = plt.subplots(2, 3, figsize=(19, 9))
    bars(axes[0][0], runs, keys, lambda r: r["rps"], "throughput (higher is better; log scale)", "requests/s", log=True)
    latency_bars(axes[0][1], runs, keys)
    proxied = [k for k in keys if k != "direct"]
    bars(
        axes[0][2],
        runs,
        proxied,
        lambda r: (r.get("proxy") or {}).get("peak_rss_mib"),
        "proxy peak RSS (VmHWM) after the level",
        "MiB",
    )
    cpu_bars(axes[1][0], runs, proxied)
    round_points(axes[1][1], runs, keys)
    if any(r["growth"] for r in doc["growth"]):
        growth_lines(axes[1][2], doc["growth"], concurrency_levels(runs))
    else:
        axes[1][2].axis("off")
        axes[1][2].text(0.5, 0.5, "no growth scenario in this run\n(--growth 0,100000,1000000)", ha="center", va="center")
    m = doc["meta"]
    fig.suptitle(
        f"receipts benchmark {m['run_id']}: {doc['settings']['requests']} POSTs/level; {m['cpu']}, {m['cores']} cores; "
        f"mitmproxy {m['versions'].get('mitmproxy')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def concurrency_levels(runs: list[Row]) -> list[int]:
    return sorted({r["concurrency"] for r in runs})


def bar_offset(i: int, count: int, width: float) -> float:
    """Where the i-th of `count` bars sits relative to its group's centre."""
    return (i - (count - 1) / 2) * width


def bars(ax: Any, runs: list[Row], keys: list[str], value: Value, title: str, ylabel: str, log: bool = False) -> None:
    """One group of bars per concurrency, one bar per target; receipts bars labelled with their ratio to (b)."""
    conc = concurrency_levels(runs)
    width = 0.8 / max(1, len(keys))
    for i, k in enumerate(keys):
        measured = [(j, r) for j, c in enumerate(conc) if (r := find_run(runs, k, c)) and value(r) is not None]
        xs = [j + bar_offset(i, len(keys), width) for j, _ in measured]
        ys = [value(r) for _, r in measured]
        drawn = ax.bar(xs, ys, width, label=TARGETS[k].label, color=COLOURS[k])
        ax.bar_label(drawn, labels=[bar_label(runs, k, r, value) for _, r in measured], fontsize=7)
    ax.set_xticks(range(len(conc)), [f"concurrency {c}" for c in conc])
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
        ax.set_ylim(top=ax.get_ylim()[1] * 3)
    else:
        ax.set_ylim(top=ax.get_ylim()[1] * 1.25)
    ax.legend(fontsize=8, loc="upper left", ncols=2)


def bar_label(runs: list[Row], key: str, run: Row, value: Value) -> str:
    own = value(run)
    assert own is not None
    base = find_run(runs, "mitmdump", run["concurrency"])
    base_value = value(base) if base else None
    ratio = f"\n{own / base_value:.2f}x(b)" if key in RECEIPTS_TARGETS and base_value else ""
    return f"{own:.0f}{ratio}"


def latency_bars(ax: Any, runs: list[Row], keys: list[str]) -> None:
    conc = concurrency_levels(runs)
    width = 0.8 / max(1, len(keys))
    for i, k in enumerate(keys):
        for j, c in enumerate(conc):
            r = find_run(runs, k, c)
            if not r or r["p50_ms"] is None:
                continue
            x = j + bar_offset(i, len(keys), width)
            ax.bar(x, r["p99_ms"], width, color=COLOURS[k], alpha=0.35)
            ax.bar(x, r["p50_ms"], width, color=COLOURS[k], label=TARGETS[k].label if j == 0 else None)
            ax.text(x, r["p50_ms"], f"{r['p50_ms']:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(conc)), [f"concurrency {c}" for c in conc])
    ax.set_yscale("log")
    ax.set_ylabel("ms (log scale)")
    ax.set_title("latency: p50 (solid, labelled) and p99 (pale)")
    ax.legend(fontsize=8)


CPU_PARTS: tuple[tuple[str, Value, float], ...] = (
    ("proxy", lambda r: (r.get("proxy") or {}).get("cpu_ms_per_request"), 1.0),
    ("journal writer", lambda r: (r.get("writer") or {}).get("cpu_ms_per_request"), 0.55),
    ("PostgreSQL server", lambda r: (r.get("postgres_server") or {}).get("cpu_ms_per_request"), 0.25),
)


def cpu_bars(ax: Any, runs: list[Row], keys: list[str]) -> None:
    """CPU ms per request, stacked: the proxy (solid), its journal writer, the PostgreSQL server (paler)."""
    conc = concurrency_levels(runs)
    width = 0.8 / max(1, len(keys))
    for i, k in enumerate(keys):
        for j, c in enumerate(conc):
            r = find_run(runs, k, c)
            if not r:
                continue
            x, bottom = j + bar_offset(i, len(keys), width), 0.0
            for part, value, alpha in CPU_PARTS:
                v = value(r)
                if v:
                    label = TARGETS[k].label if part == "proxy" and j == 0 else None
                    ax.bar(x, v, width, bottom=bottom, color=COLOURS[k], alpha=alpha, label=label)
                    bottom += v
            if bottom:
                ax.text(x, bottom, f"{bottom:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(conc)), [f"concurrency {c}" for c in conc])
    ax.set_ylabel("CPU ms per request")
    ax.set_title("CPU per request: proxy (solid), journal writer, PostgreSQL server (paler, stacked)")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.35)
    ax.legend(fontsize=8, loc="upper left", ncols=2)


def round_points(ax: Any, runs: list[Row], keys: list[str]) -> None:
    """Each round's req/s over the median of its target and level: how much the interleaved rounds spread."""
    conc = concurrency_levels(runs)
    width = 0.8 / max(1, len(keys))
    for i, k in enumerate(keys):
        for j, c in enumerate(conc):
            r = find_run(runs, k, c)
            if not r or not r["rps"]:
                continue
            x = j + bar_offset(i, len(keys), width)
            rounds = r.get("rps_rounds") or [r["rps"]]
            ax.plot(
                [x] * len(rounds),
                [v / r["rps"] for v in rounds],
                "o",
                color=COLOURS[k],
                label=TARGETS[k].label if j == 0 else None,
            )
    ax.axhline(1.0, color="#999999", linewidth=0.8)
    ax.set_xticks(range(len(conc)), [f"concurrency {c}" for c in conc])
    ax.set_ylabel("round req/s / median req/s")
    ax.set_title("the rounds: each one's throughput against the median")
    ax.legend(fontsize=8)


def growth_lines(ax: Any, growth: list[Row], conc: list[int]) -> None:
    for k in (key for key in RECEIPTS_TARGETS if TARGETS[key].growth):
        for c, style in zip(conc, GROWTH_LINE_STYLES):
            points = sorted(
                (r["growth"], r["p50_ms"])
                for r in growth
                if r["target"] == k and r["concurrency"] == c and r["p50_ms"] is not None
            )
            if points:
                ax.plot(
                    [max(g, 1) for g, _ in points],
                    [p50 for _, p50 in points],
                    style,
                    color=COLOURS[k],
                    label=f"{TARGETS[k].label} c={c} p50",
                )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("receipts already in the database (0 plotted at 1)")
    ax.set_ylabel("p50 ms (log scale)")
    ax.set_title("growth: p50 latency vs history (flat is the goal)")
    ax.legend(fontsize=7)
