"""Prometheus counters with vLLM's names, and the rolling hit rates of vLLM's stats line.

``/metrics`` is rendered in the Prometheus text format the way prometheus_client writes it
(counters get ``_total``, labels ``model_name`` then ``engine``), without depending on it: the
stand-in's runtime needs only the stdlib and aiohttp. ``CachingMetrics`` mirrors vLLM's: the
logged hit rates are token-weighted over the most recent 1000 requests, not per interval.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence

__all__ = [
    "CachingMetrics",
    "Counter",
    "Gauge",
    "Histogram",
    "Registry",
]

LabelValues = tuple[str, ...]


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Metric:
    kind = "untyped"

    def __init__(self, registry: Registry, name: str, help_text: str, labelnames: Sequence[str]) -> None:
        self.registry = registry
        self.name = name
        self.help = help_text
        self.labelnames = tuple(labelnames)

    def _labels(self, values: LabelValues, extra: Iterable[tuple[str, str]] = ()) -> str:
        pairs = [*self.registry.base.items(), *zip(self.labelnames, values, strict=True), *extra]
        return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"

    def render(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    kind = "counter"

    def __init__(self, registry: Registry, name: str, help_text: str, labelnames: Sequence[str] = (),
                 preset: Iterable[LabelValues] = ()) -> None:
        super().__init__(registry, name, help_text, labelnames)
        self.values: dict[LabelValues, float] = {tuple(v): 0.0 for v in preset}
        if not self.labelnames:
            self.values[()] = 0.0

    def inc(self, amount: float = 1.0, *labels: str) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def get(self, *labels: str) -> float:
        return self.values.get(labels, 0.0)

    def render(self) -> list[str]:
        full = self.name + "_total"
        lines = [f"# HELP {full} {self.help}", f"# TYPE {full} counter"]
        lines.extend(f"{full}{self._labels(k)} {_fmt(v)}" for k, v in self.values.items())
        return lines


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, registry: Registry, name: str, help_text: str, labelnames: Sequence[str] = (),
                 fn: Callable[[], dict[LabelValues, float]] | Callable[[], float] | None = None) -> None:
        super().__init__(registry, name, help_text, labelnames)
        self.values: dict[LabelValues, float] = {}
        self.fn = fn

    def set(self, value: float, *labels: str) -> None:
        self.values[labels] = value

    def render(self) -> list[str]:
        values = self.values
        if self.fn is not None:
            got = self.fn()
            values = got if isinstance(got, dict) else {(): float(got)}
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge"]
        lines.extend(f"{self.name}{self._labels(k)} {_fmt(v)}" for k, v in values.items())
        return lines


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, registry: Registry, name: str, help_text: str, buckets: Sequence[float]) -> None:
        super().__init__(registry, name, help_text, ())
        self.buckets = [*sorted(buckets), math.inf]
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, count in zip(self.buckets, self.counts, strict=True):
            cumulative += count
            lines.append(f"{self.name}_bucket{self._labels((), [('le', _fmt(bound))])} {_fmt(cumulative)}")
        lines.append(f"{self.name}_count{self._labels(())} {_fmt(self.count)}")
        lines.append(f"{self.name}_sum{self._labels(())} {_fmt(self.sum)}")
        return lines


class Registry:
    """The metrics of one engine; every sample carries ``model_name`` and ``engine`` labels."""

    def __init__(self, model_name: str, engine: str = "0") -> None:
        self.base = {"model_name": model_name, "engine": engine}
        self.metrics: list[_Metric] = []

    def counter(self, name: str, help_text: str, labelnames: Sequence[str] = (),
                preset: Iterable[LabelValues] = ()) -> Counter:
        metric = Counter(self, name, help_text, labelnames, preset)
        self.metrics.append(metric)
        return metric

    def gauge(self, name: str, help_text: str, labelnames: Sequence[str] = (),
              fn: Callable[[], dict[LabelValues, float]] | Callable[[], float] | None = None) -> Gauge:
        metric = Gauge(self, name, help_text, labelnames, fn)
        self.metrics.append(metric)
        return metric

    def histogram(self, name: str, help_text: str, buckets: Sequence[float]) -> Histogram:
        metric = Histogram(self, name, help_text, buckets)
        self.metrics.append(metric)
        return metric

    def render(self) -> str:
        lines: list[str] = []
        for metric in self.metrics:
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"


class CachingMetrics:
    """Token-weighted hit rate over the most recent ``max_recent_requests`` requests (vLLM's rule)."""

    def __init__(self, max_recent_requests: int = 1000) -> None:
        self.recent: deque[tuple[int, int]] = deque(maxlen=max_recent_requests)
        self.queries = 0
        self.hits = 0

    def observe(self, queries: int, hits: int) -> None:
        if len(self.recent) == self.recent.maxlen:
            old_q, old_h = self.recent[0]
            self.queries -= old_q
            self.hits -= old_h
        self.recent.append((queries, hits))
        self.queries += queries
        self.hits += hits

    def reset(self) -> None:
        self.recent.clear()
        self.queries = 0
        self.hits = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0
