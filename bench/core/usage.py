"""A process's CPU time, memory and context switches, read from /proc; finding the journal writer; the
PostgreSQL server's CPU time."""

import os
import statistics
import threading
import time
from typing import Any, Self

CLK_TCK = os.sysconf("SC_CLK_TCK")
WRITER_MODULE = "proxy_addon.journal.writer"


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, ... in KiB, from /proc/PID/status."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("Vm", "Threads", "voluntary_ctxt", "nonvoluntary_ctxt")):
                    name, _, value = line.partition(":")
                    out[name] = int(value.split()[0])
    except (OSError, ValueError):
        pass
    return out


def proc_stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (so index 0 is field 3, the state), or [] if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return []


def proc_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the whole process, all threads."""
    fields = proc_stat(pid)
    try:
        return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK  # utime, stime
    except (ValueError, IndexError):
        return 0.0, 0.0


def proc_start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with the pid, it names one process, even if pids are reused."""
    fields = proc_stat(pid)
    return int(fields[19]) if len(fields) > 19 else None


def proc_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def find_child(parent: int, needle: str) -> int | None:
    """A direct child of `parent` whose command line contains `needle` (the lowest pid if several), or None."""
    for pid in sorted(all_pids()):
        fields = proc_stat(pid)
        if len(fields) > 1 and fields[1] == str(parent) and needle in proc_cmdline(pid):
            return pid
    return None


def find_writer(proxy_pid: int) -> int | None:
    """The receipts proxy's journal writer child (`python -m proxy_addon.journal.writer ...`), if it runs one."""
    return find_child(proxy_pid, WRITER_MODULE)


class RssSampler(threading.Thread):
    """Samples VmRSS every `interval` seconds until stopped, at most `max_seconds`."""

    def __init__(self, pid: int, interval: float = 0.1, max_seconds: float = 1800.0):
        super().__init__(daemon=True)
        self.pid, self.interval, self.max_seconds = pid, interval, max_seconds
        self.samples: list[int] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        limit = time.monotonic() + self.max_seconds
        while time.monotonic() < limit:
            rss = proc_status(self.pid).get("VmRSS")
            if rss is not None:
                self.samples.append(rss)
            if self._stop_event.wait(self.interval):
                return

    def stop(self) -> list[int]:
        self._stop_event.set()
        self.join(5)
        return self.samples


def mib(kib: int) -> float:
    return round(kib / 1024, 1)


class LevelUsage:
    """One process's usage across a measured level: CPU and context switches from start to end, RSS sampled meanwhile."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start_time = proc_start_time(pid)
        self.sampler = RssSampler(pid)
        self.cpu_before = proc_cpu(pid)
        self.status_before = proc_status(pid)
        self.samples: list[int] = []

    def __enter__(self) -> Self:
        self.sampler.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.samples = self.sampler.stop()

    def gone(self) -> bool:
        """The process exited (or was replaced under the same pid) during the level: its figures are meaningless."""
        return self.start_time is None or proc_start_time(self.pid) != self.start_time

    def summary(self, ok: int, elapsed_s: float) -> dict[str, Any]:
        if self.gone():
            return {"pid": self.pid, "gone": True, "cpu_ms": None, "cpu_ms_per_request": None, "peak_rss_mib": None}
        status = proc_status(self.pid)
        user, system = (after - before for before, after in zip(self.cpu_before, proc_cpu(self.pid), strict=True))
        cpu = user + system
        samples = self.samples

        def per_request(value: float, scale: float = 1000.0, digits: int = 3) -> float | None:
            return round(value * scale / ok, digits) if ok > 0 else None

        return {
            "pid": self.pid,
            "peak_rss_mib": mib(status.get("VmHWM", 0)),
            "rss_end_mib": mib(status.get("VmRSS", 0)),
            "rss_max_sampled_mib": mib(max(samples)) if samples else None,
            "rss_growth_in_level_mib": rss_growth_mib(samples),
            "rss_samples": len(samples),
            "rss_timeline_mib": rss_timeline_mib(samples),
            "threads": status.get("Threads"),
            "cpu_ms": round(cpu * 1000, 1),
            "cpu_ms_per_request": per_request(cpu),
            "cpu_user_ms_per_request": per_request(user),
            "cpu_system_ms_per_request": per_request(system),
            "context_switches_per_request": per_request(
                context_switches(status) - context_switches(self.status_before), scale=1.0, digits=1
            ),
            "cpu_utilisation": round(cpu / elapsed_s, 2) if elapsed_s else None,
        }


class ProxyLevelUsage:
    """A proxy process and its journal writer child, if it runs one, across a level.

    The writer is looked up when the level starts, since the proxy may have restarted it since the last level;
    if it is replaced during the level, its figures are left out (`writer.gone`).
    """

    def __init__(self, pid: int, journaled: bool) -> None:
        self.proxy = LevelUsage(pid)
        writer_pid = find_writer(pid) if journaled else None
        self.writer = LevelUsage(writer_pid) if writer_pid is not None else None

    def __enter__(self) -> Self:
        self.proxy.__enter__()
        if self.writer is not None:
            self.writer.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.writer is not None:
            self.writer.__exit__(*exc_info)
        self.proxy.__exit__(*exc_info)

    def summary(self, ok: int, elapsed_s: float) -> dict[str, Any]:
        """{"proxy": ..., "writer": ... or None, "proxy_writer_cpu_ms_per_request": ... or None}"""
        proxy = self.proxy.summary(ok, elapsed_s)
        writer = self.writer.summary(ok, elapsed_s) if self.writer is not None else None
        both = None
        if writer is not None and writer["cpu_ms_per_request"] is not None and proxy["cpu_ms_per_request"] is not None:
            both = round(proxy["cpu_ms_per_request"] + writer["cpu_ms_per_request"], 3)
        return {"proxy": proxy, "writer": writer, "proxy_writer_cpu_ms_per_request": both}


def rss_growth_mib(samples: list[int]) -> float | None:
    """The median of the last fifth of the samples minus that of the first fifth."""
    if len(samples) < 5:
        return None
    fifth = len(samples) // 5
    return round((statistics.median(samples[-fifth:]) - statistics.median(samples[:fifth])) / 1024, 2)


def rss_timeline_mib(samples: list[int], points: int = 40) -> list[float]:
    if len(samples) < points:
        return [mib(x) for x in samples]
    return [mib(samples[i * len(samples) // points]) for i in range(points)]


def context_switches(status: dict[str, int]) -> int:
    return status.get("voluntary_ctxt_switches", 0) + status.get("nonvoluntary_ctxt_switches", 0)


# The cluster-wide processes that do the commits' deferred work (flushing WAL and dirty pages).
PG_SHARED_PROCESSES = ("walwriter", "background writer", "checkpointer")


def pg_server_cpu(database: str) -> dict[tuple[int, int], float]:
    """CPU seconds (user + system) of the PostgreSQL processes working for `database`, by (pid, start time).

    Those are the backends connected to it (and autovacuum workers on it: `postgres: [cluster:] user DATABASE
    host(port) state`) and the shared WAL writer, background writer and checkpointer. Backends of other
    databases (another test run on the same server) are left out.
    """
    out: dict[tuple[int, int], float] = {}
    for pid in all_pids():
        cmdline = proc_cmdline(pid)
        if not cmdline.startswith("postgres:"):
            continue
        if database not in cmdline.split() and not any(name in cmdline for name in PG_SHARED_PROCESSES):
            continue
        fields = proc_stat(pid)
        try:
            out[(pid, int(fields[19]))] = (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (ValueError, IndexError):
            continue
    return out


class PgServerUsage:
    """The PostgreSQL server's CPU for one database across a level: the processes alive at its end, each minus its
    own CPU at the start (0 if it started during the level). A backend that exits during the level is not counted;
    the receipts proxy keeps its connections in a pool, so that is rare."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.before = pg_server_cpu(database)

    def summary(self, ok: int) -> dict[str, Any]:
        after = pg_server_cpu(self.database)
        cpu = sum(seconds - self.before.get(key, 0.0) for key, seconds in after.items())
        return {
            "database": self.database,
            "processes": len(after),
            "cpu_ms_per_request": round(cpu * 1000 / max(1, ok), 3),
        }
