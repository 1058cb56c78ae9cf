"""The benchmark works: its smoke form (200 POSTs at concurrency 1 and 8, one round, direct, plain mitmdump and
the receipts proxy on SQLite) runs end to end, checks its own receipts, and writes the results document.

This is not a timed test: it asserts that the harness works, not how fast the proxy is.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_bench_smoke(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=170,
        cwd=REPO,
    )
    assert done.returncode == 0, f"bench smoke failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["ok"] is True and doc["failures"] == []
    by_target: dict[str, list[dict]] = {}
    for run in doc["runs"]:
        by_target.setdefault(run["target"], []).append(run)
    assert set(by_target) == {"direct", "mitmdump", "sqlite"}
    for target, runs in by_target.items():
        assert sorted(r["concurrency"] for r in runs) == [1, 8], target
        for r in runs:
            assert r["rps"] > 0, (target, r)
            assert r["errors"] == 0 and r["ok"] == r["requests"] == 200, (target, r)
            assert r["p50_ms"] is not None and r["p99_ms"] >= r["p50_ms"], (target, r)
            if target != "direct":
                assert r["proxy"]["peak_rss_mib"] > 0, (target, r)
    for r in by_target["sqlite"]:
        assert r["verify"]["ok"] and r["verify"]["states"] == {"succeeded": 200}, r
    assert {(r["target"], r["concurrency"]) for r in doc["ratios"]} == {("sqlite", 1), ("sqlite", 8)}
    assert "| (c) receipts SQLite |" in done.stdout  # the Markdown table

    # one round: each level measured once, kept as measured in "rounds", its median (itself) in "runs"
    assert doc["settings"]["rounds"] == 1
    assert sorted((r["target"], r["concurrency"], r["round"]) for r in doc["rounds"]) == sorted(
        (r["target"], r["concurrency"], 0) for r in doc["runs"]
    )
    for r in by_target["sqlite"]:
        assert r["rounds"] == 1 and r["rps_rounds"] == [r["rps"]], r
        assert r["proxy"]["cpu_ms_per_request"] > 0, r
        # the journal writer's figures: present when the proxy runs a writer child, empty (None) otherwise
        assert "writer" in r and "proxy_writer_cpu_ms_per_request" in r, r
        if r["proxy_writer_cpu_ms_per_request"] is not None:
            assert r["proxy_writer_cpu_ms_per_request"] >= r["proxy"]["cpu_ms_per_request"], r
    assert "| CPU per request |" in done.stdout
