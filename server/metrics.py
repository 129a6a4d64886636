"""Prometheus text exposition of the scheduler (names, help texts and buckets as colibri's)."""

from __future__ import annotations

from dataclasses import dataclass, field

BUCKETS: tuple[float, ...] = (0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)


@dataclass
class Histogram:
    name: str
    help: str
    counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    total: int = 0
    sum: float = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(BUCKETS):
            if value <= bound:
                self.counts[i] += 1
        self.total += 1
        self.sum += value

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for bound, count in zip(BUCKETS, self.counts, strict=True):
            out.append(f'{self.name}_bucket{{le="{bound}"}} {count}')
        out.append(f'{self.name}_bucket{{le="+Inf"}} {self.total}')
        out.append(f"{self.name}_sum {float(self.sum)!r}")
        out.append(f"{self.name}_count {self.total}")
        return out


PREFIX = "colibri_scheduler_"


class GenerationMetrics:
    def __init__(self) -> None:
        self.queue_wait = Histogram(PREFIX + "queue_wait_seconds",
                                    "Queue wait of admitted requests only.")
        self.slot_duration = Histogram(
            PREFIX + "slot_duration_seconds",
            "Slot occupancy of finished admitted requests, including errors and cancellation.")
        self.first_output = Histogram(
            PREFIX + "first_output_seconds",
            "Engine-call start to first nonempty text or tool callback, excluding queue wait.")
        self.engine_call = Histogram(
            PREFIX + "engine_call_seconds",
            "Duration of finished engine generation calls, including errors and cancellation.")


GAUGES = (("active", "Currently admitted requests."),
          ("queued", "Requests waiting for a KV slot."),
          ("capacity", "Concurrent KV slots configured."),
          ("max_queue", "Maximum waiting requests configured."))
COUNTERS = (("admitted", "Requests admitted to a KV slot."),
            ("completed", "Admitted requests that returned normally."),
            ("failed", "Admitted requests that raised an error."),
            ("rejected", "Requests rejected because the queue was full."),
            ("timed_out", "Requests that timed out waiting for a slot."),
            ("cancelled", "Requests cancelled while queued or admitted."))


def render(snapshot: dict[str, float | int], metrics: GenerationMetrics) -> str:
    lines: list[str] = []
    for key, text in GAUGES:
        name = PREFIX + key
        lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name} {snapshot[key]}"]
    for key, text in COUNTERS:
        name = f"{PREFIX}{key}_total"
        lines += [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name} {snapshot[key]}"]
    for hist in (metrics.queue_wait, metrics.slot_duration, metrics.first_output,
                 metrics.engine_call):
        lines += hist.lines()
    return "\n".join(lines) + "\n"
