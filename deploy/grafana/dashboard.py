"""The receipts Grafana dashboard, generated with grafana-foundation-sdk: `python deploy/grafana/dashboard.py`
writes deploy/grafana/dashboards/receipts.json (tests/unit/test_dashboards.py checks that the committed file is
what this makes, and tests/e2e/test_dashboards.py that every query runs on a real Prometheus scraping a proxy).

Each panel is one line of the PANELS table: its title, its PromQL, the legend, the unit. The queries use the job
name of deploy/prometheus/prometheus.yml (`receipts`), as the alert rules do; the database gauges are the same on
every replica, so they take the max across instances.
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos

OUTPUT = Path(__file__).resolve().parent / "dashboards" / "receipts.json"
UID = "receipts-overview"
JOB = 'job="receipts"'
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
OPEN = "planned|submitted|outcome_unknown|reconciling|manual_review"
UNKNOWN = "outcome_unknown|reconciling|manual_review"
PANEL_HEIGHT = 8


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    stacked: bool = False
    description: str = ""


def rate(metric: str, by: str) -> str:
    return f"sum by ({by}) (rate({metric}{{{JOB}}}[$__rate_interval]))"


def quantile(q: float, histogram: str, by: str = "le") -> str:
    return f"histogram_quantile({q}, sum by ({by}) (rate({histogram}_bucket{{{JOB}}}[$__rate_interval])))"


PANELS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    ("Writes", (
        PanelSpec("Writes per second by state", (Query(rate("receipts_writes_total", "state"), "{{state}}"),), "reqps",
                  stacked=True, description="Journaled writes answered with a receipt of their own, by its state in the answer"),
        PanelSpec("Writes per second by host", (Query(rate("receipts_writes_total", "host"), "{{host}}"),), "reqps", stacked=True),
        PanelSpec("Writes per second by host and state", (Query(rate("receipts_writes_total", "host, state"), "{{host}} {{state}}"),), "reqps"),
        PanelSpec("Writes journaled per second by agent", (Query(rate("receipts_agent_journaled_total", "agent"), "{{agent}}"),), "reqps",
                  stacked=True),
    )),
    ("Open and unknown receipts", (
        PanelSpec("Open receipts by state", (Query(f'max by (state) (receipts_by_state{{{JOB}, state=~"{OPEN}"}})', "{{state}}"),),
                  kind="stat"),
        PanelSpec("Oldest receipt in each open state", (Query(f"max by (state) (receipts_oldest_age_seconds{{{JOB}}})", "{{state}}"),), "s",
                  description="Age of the oldest receipt in each open state; the unknown ones block their retries"),
        PanelSpec("Unknown receipts", (Query(f'max by (state) (receipts_by_state{{{JOB}, state=~"{UNKNOWN}"}})', "{{state}}"),),
                  stacked=True),
    )),
    ("Refusals and replays", (
        PanelSpec("Duplicates refused or replayed per second", (Query(rate("receipts_duplicates_total", "reason"), "{{reason}}"),), "reqps",
                  stacked=True),
        PanelSpec("Writes not journaled (journal unavailable) per second",
                  (Query(rate("receipts_journal_unavailable_total", "instance, action"), "{{instance}} {{action}}"),), "reqps"),
        PanelSpec("Writes waiting for approval per second", (Query(rate("receipts_approvals_awaited_total", "state"), "{{state}}"),), "reqps"),
    )),
    ("Reconcile", (
        PanelSpec("Reconcile verdicts per second", (Query(rate("receipts_reconcile_verdicts_total", "state"), "{{state}}"),), "ops",
                  stacked=True, description="Counted by the processes that run the worker and are scraped"),
        PanelSpec("Unproven read rules", (Query(f"max(receipts_unproven_rules{{{JOB}}})"),), kind="stat"),
        PanelSpec("Reused-connection unknowns per second",
                  (Query(rate("receipts_reused_connection_unknowns_total", "instance"), "{{instance}}"),), "ops"),
    )),
    ("Journal", (
        PanelSpec("Journal latency (arrival to receipt committed)", (
            Query(quantile(0.5, "receipts_journal_seconds"), "p50"),
            Query(quantile(0.99, "receipts_journal_seconds"), "p99"),
        ), "s"),
        PanelSpec("Verdict commit latency (p99)", (Query(quantile(0.99, "receipts_verdict_seconds", "le, answer"), "answer {{answer}}"),), "s"),
        PanelSpec("Journal writer restarts and pending writes", (
            Query(f"sum by (instance, cause) (increase(receipts_journal_writer_restarts_total{{{JOB}}}[$__rate_interval]))",
                  "restarts {{instance}} {{cause}}"),
            Query(f"receipts_journal_writer_pending{{{JOB}}}", "pending {{instance}}"),
        )),
    )),
    ("Approvals", (
        PanelSpec("Approvals pending", (Query(f"max(receipts_approvals_pending{{{JOB}}})"),), kind="stat"),
        PanelSpec("Longest approval wait, as a share of its expiry", (Query(f"max(receipts_approval_wait_ratio{{{JOB}}})"),),
                  "percentunit", kind="stat"),
        PanelSpec("Approval decisions per second", (Query(rate("receipts_approval_decisions_total", "decision"), "{{decision}}"),), "ops"),
    )),
    ("Instances", (
        PanelSpec("Proxies answering scrapes", (Query(f"sum(up{{{JOB}}})"),), kind="stat"),
        PanelSpec("Proxy instances (heartbeats)", (Query(f"max by (status) (receipts_proxy_instances{{{JOB}}})", "{{status}}"),)),
        PanelSpec("Store readable", (Query(f"min(receipts_store_up{{{JOB}}})"),), kind="stat"),
    )),
)  # fmt: skip


def panel(spec: PanelSpec, panel_id: int, grid: GridPos) -> dashboard_builders.Panel:
    built = timeseries.Panel() if spec.kind == "timeseries" else stat.Panel()
    built.id(panel_id).title(spec.title).datasource(DATASOURCE).unit(spec.unit).grid_pos(grid)
    if spec.description:
        built.description(spec.description)
    for ref, query in zip("ABCDEFGH", spec.queries, strict=False):
        built.with_target(prometheus.Dataquery().expr(query.expr).legend_format(query.legend or "__auto").ref_id(ref))
    if isinstance(built, timeseries.Panel):
        built.fill_opacity(20 if spec.stacked else 8).line_width(1).min(0)
        built.legend(common_builders.VizLegendOptions().display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM).show_legend(True))
        if spec.stacked:
            built.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    else:
        built.graph_mode(common.BigValueGraphMode.AREA).reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
    return built


def build() -> dict[str, object]:
    board = (
        dashboard_builders.Dashboard("receipts")
        .uid(UID)
        .description("The write journal: writes, open and unknown receipts, refusals, reconcile verdicts, journal "
                     "latency, approvals, instances. Generated by deploy/grafana/dashboard.py.")
        .tags(["receipts"])
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("utc")
        .editable()
        .with_variable(dashboard_builders.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    )
    y, panel_id = 0, 0
    for title, specs in PANELS:
        panel_id += 1
        board.with_row(dashboard_builders.Row(title).id(panel_id).grid_pos(GridPos(h=1, w=24, x=0, y=y)))
        y += 1
        width = 24 // len(specs)
        for i, spec in enumerate(specs):
            panel_id += 1
            board.with_panel(panel(spec, panel_id, GridPos(h=PANEL_HEIGHT, w=width, x=i * width, y=y)))
        y += PANEL_HEIGHT
    document: dict[str, object] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return document


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(render())
    print(f"wrote {OUTPUT.relative_to(Path.cwd()) if OUTPUT.is_relative_to(Path.cwd()) else OUTPUT}", file=sys.stderr)
