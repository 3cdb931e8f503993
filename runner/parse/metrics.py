"""Parse Prometheus ``/metrics`` text and compute per-run counter deltas and hit rates.

vLLM's periodic log line reports prefix-cache hit rates over the most recent 1000 requests,
which is not a per-run figure. The per-run rate comes from the difference of the
``vllm:prefix_cache_hits_total`` and ``vllm:prefix_cache_queries_total`` counters (tokens)
scraped before and after a run, and likewise for the ``vllm:external_prefix_cache_*``
counters (KV connector / offload tier). Older V1 releases (0.8-0.10) exported the same
counters as ``vllm:gpu_prefix_cache_{hits,queries}_total``; they are used when the new names
are absent.

:func:`parse_metrics_text` returns one flat ``dict`` keyed by sample name:

* each sample under its name with its labels rendered the Prometheus way, label names sorted
  (``vllm:prefix_cache_hits_total{engine="0",model_name="m"}``); a sample without labels is
  keyed by its bare name;
* plus, per sample name, the sum over all its label sets under the bare name
  (``vllm:prefix_cache_hits_total``), which is what the delta helpers use (summing engines and
  models). Sums are meant for counters; they are skipped for histogram ``_bucket``, summary
  ``quantile`` and ``_created`` timestamp samples, where they would be meaningless.

Sample names keep ``_total`` (prometheus_client strips it from counter *family* names only);
the helpers accept a name with or without ``_total``. NaN samples are dropped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from runner.errors import ParseError

__all__ = [
    "EXTERNAL_PREFIX_CACHE_COUNTERS",
    "PREFIX_CACHE_COUNTERS",
    "counter_deltas",
    "parse_metrics_text",
    "prefix_cache_run_rates",
]

log = logging.getLogger(__name__)

Scrape = Mapping[str, float]  # a parse_metrics_text() result
Pair = tuple[str, str]  # (hits counter, queries counter)

# (hits, queries) counter names, newest first.
PREFIX_CACHE_COUNTERS: tuple[Pair, ...] = (
    ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
)
EXTERNAL_PREFIX_CACHE_COUNTERS: tuple[Pair, ...] = (
    ("vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total"),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _render(name: str, labels: Mapping[str, str]) -> str:
    if not labels:
        return name
    body = ",".join(f'{key}="{_escape(labels[key])}"' for key in sorted(labels))
    return f"{name}{{{body}}}"


def parse_metrics_text(text: str, *, source: str = "<metrics>") -> dict[str, float]:
    """Parse Prometheus text exposition into ``{rendered sample: value}`` plus per-name sums.

    Raises :class:`ParseError` (naming ``source``) when the text is not valid exposition.
    """
    samples: dict[str, float] = {}
    sums: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                value = float(sample.value)
                if math.isnan(value):
                    continue
                labels = sample.labels
                samples[_render(sample.name, labels)] = value
                if sample.name.endswith(("_bucket", "_created")) or "quantile" in labels:
                    continue
                sums[sample.name] = sums.get(sample.name, 0.0) + value
    except ValueError as exc:
        raise ParseError(source, f"not Prometheus text exposition: {exc}") from exc
    # A sample without labels is keyed by its bare name already; the sum is the same value.
    samples.update(sums)
    return samples


def _lookup(values: Scrape, name: str) -> float | None:
    if name in values:
        return values[name]
    alt = name[: -len("_total")] if name.endswith("_total") else name + "_total"
    return values.get(alt)


def counter_deltas(before: Scrape, after: Scrape, names: Iterable[str]) -> dict[str, float]:
    """``after - before`` for each counter in ``names`` (with or without ``_total``).

    A name absent from ``after`` is omitted. A name absent from ``before`` counts from 0 (the
    counter appeared during the run). A negative difference means the counter was reset (the
    server restarted), so the delta is the ``after`` value, as Prometheus' ``increase()``
    assumes; a warning is logged.
    """
    deltas: dict[str, float] = {}
    for name in names:
        end = _lookup(after, name)
        if end is None:
            continue
        start = _lookup(before, name)
        delta = end - (start or 0.0)
        if delta < 0:
            log.warning("counter %s went down (%s -> %s): reset, using %s", name, start, end, end)
            delta = end
        deltas[name] = delta
    return deltas


def _pick_pair(before: Scrape, after: Scrape, pairs: tuple[Pair, ...]) -> tuple[float, float] | None:
    for hits_name, queries_name in pairs:
        deltas = counter_deltas(before, after, (hits_name, queries_name))
        if hits_name in deltas and queries_name in deltas:
            return deltas[hits_name], deltas[queries_name]
    return None


def prefix_cache_run_rates(before: Scrape, after: Scrape) -> dict[str, float]:
    """Per-run prefix-cache figures from two scrapes (``parse_metrics_text`` results).

    Keys: ``prefix_cache_hits``, ``prefix_cache_queries`` (token deltas) and
    ``prefix_cache_hit_pct`` (100 * hits / queries); the same with ``external_`` in front for
    the connector / offload tier. Counters absent from ``after`` give no keys; a ``_hit_pct``
    key is omitted when its queries delta is 0 (no rate without queries).
    """
    rates: dict[str, float] = {}
    for prefix, pairs in (
        ("prefix_cache", PREFIX_CACHE_COUNTERS),
        ("external_prefix_cache", EXTERNAL_PREFIX_CACHE_COUNTERS),
    ):
        pair = _pick_pair(before, after, pairs)
        if pair is None:
            continue
        hits, queries = pair
        rates[f"{prefix}_hits"] = hits
        rates[f"{prefix}_queries"] = queries
        if queries > 0:
            rates[f"{prefix}_hit_pct"] = 100.0 * hits / queries
    return rates
