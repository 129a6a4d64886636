"""Prometheus text exposition of the scheduler through ``prometheus_client`` (names, help
texts, order and buckets as colibri's; spec/http.md §10, DEVIATIONS "Metrics exposition").

The gauges and counters are the scheduler's own numbers, read once per scrape from one
snapshot, so a scrape can never show, say, more completed than admitted requests. The four
latency histograms are ``prometheus_client.Histogram`` objects that live as long as the
server; they are not registered globally (several servers may run in one process, as the
tests do); their ``_created`` samples are left out and ``_sum`` comes before ``_count``, as
in colibri's exposition.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

BUCKETS: tuple[float, ...] = (0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)
PREFIX = "colibri_scheduler_"


def _histogram(name: str, text: str) -> Histogram:
    return Histogram(PREFIX + name, text, buckets=BUCKETS, registry=None)


class GenerationMetrics:
    def __init__(self) -> None:
        self.queue_wait = _histogram("queue_wait_seconds",
                                     "Queue wait of admitted requests only.")
        self.slot_duration = _histogram(
            "slot_duration_seconds",
            "Slot occupancy of finished admitted requests, including errors and cancellation.")
        self.first_output = _histogram(
            "first_output_seconds",
            "Engine-call start to first nonempty text or tool callback, excluding queue wait.")
        self.engine_call = _histogram(
            "engine_call_seconds",
            "Duration of finished engine generation calls, including errors and cancellation.")

    def histograms(self) -> tuple[Histogram, ...]:
        return (self.queue_wait, self.slot_duration, self.first_output, self.engine_call)


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


class _Scrape(Collector):
    """One scrape: the snapshot's gauges and counters, then the histograms, in that order."""

    def __init__(self, snapshot: dict[str, float | int], histograms: Iterable[Histogram]):
        self.snapshot = snapshot
        self.histograms = tuple(histograms)

    def collect(self) -> Iterator[Metric]:
        for key, text in GAUGES:
            yield GaugeMetricFamily(PREFIX + key, text, value=self.snapshot[key])
        for key, text in COUNTERS:
            yield CounterMetricFamily(PREFIX + key, text, value=self.snapshot[key])
        for histogram in self.histograms:
            for family in histogram.collect():
                # colibri's order: the buckets, _sum, then _count; and no _created.
                order = {"_bucket": 0, "_sum": 1, "_count": 2}
                kept = [s for s in family.samples if not s.name.endswith("_created")]
                family.samples = sorted(
                    kept, key=lambda s: order[s.name[s.name.rindex("_"):]])
                yield family


def render(snapshot: dict[str, float | int], metrics: GenerationMetrics) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape(snapshot, metrics.histograms()))
    return generate_latest(registry).decode("utf-8")
