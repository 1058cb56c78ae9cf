"""A process's CPU time, memory and context switches, read from /proc."""

import os
import statistics
import threading
import time
from typing import Any, Self

CLK_TCK = os.sysconf("SC_CLK_TCK")


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


def proc_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the whole process, all threads."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK  # utime, stime
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0


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
        self.sampler = RssSampler(pid)
        self.cpu_before = proc_cpu(pid)
        self.status_before = proc_status(pid)
        self.samples: list[int] = []

    def __enter__(self) -> Self:
        self.sampler.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.samples = self.sampler.stop()

    def summary(self, ok: int, elapsed_s: float) -> dict[str, Any]:
        status = proc_status(self.pid)
        user, system = (after - before for before, after in zip(self.cpu_before, proc_cpu(self.pid), strict=True))
        cpu = user + system
        requests_ok = max(1, ok)
        samples = self.samples
        return {
            "peak_rss_mib": mib(status.get("VmHWM", 0)),
            "rss_end_mib": mib(status.get("VmRSS", 0)),
            "rss_max_sampled_mib": mib(max(samples)) if samples else None,
            "rss_growth_in_level_mib": rss_growth_mib(samples),
            "rss_samples": len(samples),
            "rss_timeline_mib": rss_timeline_mib(samples),
            "threads": status.get("Threads"),
            "cpu_ms_per_request": round(cpu * 1000 / requests_ok, 3),
            "cpu_user_ms_per_request": round(user * 1000 / requests_ok, 3),
            "cpu_system_ms_per_request": round(system * 1000 / requests_ok, 3),
            "context_switches_per_request": round(
                (context_switches(status) - context_switches(self.status_before)) / requests_ok, 1
            ),
            "cpu_utilisation": round(cpu / elapsed_s, 2) if elapsed_s else None,
        }


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
