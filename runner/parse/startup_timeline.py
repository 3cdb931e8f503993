"""One start as a timeline: every second from the start command to the first token, in named phases.

The boundaries come from three sources, each as precise as it is:

* the **timer** (``timings.json`` of ``nodetools.coldstart measure``): the start command (time 0),
  the log's first byte, the port opening and the first token, polled every ``poll_s``; its
  ``clock`` maps the node's wall clock (and its local time zone) to those seconds;
* the **processes** the timer saw in the engine's process group (``processes``: start times from
  ``/proc``, to the clock tick): when the EngineCore process began;
* the **server log** (:func:`runner.parse.vllm_log.parse_log_file`): the timestamps of its phase
  lines, and the durations its lines state (``Model loading took 2.98 s``, ``torch.compile took
  23.58 s``), which place where a phase began.

vLLM stamps its lines to the whole second unless the log has milliseconds: such a boundary is
known to one second, and is placed in the middle of its second (``timeline_resolution_s`` is 1.0;
0.001 with milliseconds), earlier within it where a later boundary the timer saw is earlier (the
port opened before the middle of the second "init engine" was logged in), later within it where
a stated duration that ends there needs the room. A timer event that agrees with a stamp replaces
it. Boundaries are kept
in order (a later one never before an earlier one) and never after the first token, so the
phases and ``other_s`` (time between boundaries that no phase names, or where a boundary is
missing) add up to ``first_token_s``.

Phases, in order (a phase whose boundaries are missing is absent, never 0):

``api_imports_s`` start command -> the log's first line (the API server's imports);
``config_s`` -> the last line before the EngineCore's first (config, model inspection);
``engine_spawn_s`` -> the EngineCore process exists (tokenizer set-up, the spawn);
``engine_imports_s`` -> the EngineCore's first line (from the last config line when the timer
saw no EngineCore process: a docker engine, an older timings.json);
``device_init_s`` -> model loading begins (CUDA context, distributed and worker set-up);
``weights_s`` model loading, as logged; ``compile_s`` torch.compile, as logged (a cache hit or
miss: ``compile_cache_hit``); ``kv_profile_s`` the rest of vLLM's profiling run and KV
allocation: from model loading to torch.compile (the profiling run, which compiles, begins),
from torch.compile to the KV cache size line, and on to graph capture (a host-RAM KV tier,
kernel autotuning);
``graph_capture_s`` CUDA graphs, as logged; ``kernel_jit_s`` -> "init engine"
done (kernel JIT and warm-up, after graph capture or, under ``--enforce-eager``, after the KV
allocation); ``api_ready_s`` -> the port opens (else the API server's ready line);
``first_request_s`` -> the first token.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = ["ANCHORS", "PHASES", "PHASE_NAMES", "boundaries", "log_clock", "timeline"]

# Boundaries in the order a start passes them.
ANCHORS = ("start", "api_first", "api_config", "engine_process", "engine_first", "weights_start", "weights_end",
           "compile_start", "compile_end", "kv_end", "graph_start", "graph_end", "engine_ready", "api_ready",
           "first_token")
# (phase, its end boundary, the boundaries it may start from: the nearest earlier one present must
# be one of them). A phase named more than once is the sum of its spans.
PHASES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("api_imports_s", "api_first", ("start",)),
    ("config_s", "api_config", ("api_first",)),
    ("engine_spawn_s", "engine_process", ("api_config",)),
    ("engine_imports_s", "engine_first", ("engine_process", "api_config")),
    ("device_init_s", "weights_start", ("engine_first",)),
    ("weights_s", "weights_end", ("weights_start",)),
    ("kv_profile_s", "compile_start", ("weights_end",)),  # "init engine" begins: the profiling run, before Dynamo
    ("compile_s", "compile_end", ("compile_start",)),
    ("kv_profile_s", "kv_end", ("compile_end", "weights_end")),
    ("kv_profile_s", "graph_start", ("kv_end",)),  # what follows the GPU pool: a host-RAM KV tier, autotuning
    ("graph_capture_s", "graph_end", ("graph_start",)),
    ("kernel_jit_s", "engine_ready", ("graph_end", "kv_end")),
    ("api_ready_s", "api_ready", ("engine_ready",)),
    ("first_request_s", "first_token", ("api_ready",)),
)
# The phases as tables and charts show them: in the order a start passes them, torch.compile before
# the rest of the profiling run that wraps it.
PHASE_NAMES = ("api_imports_s", "config_s", "engine_spawn_s", "engine_imports_s", "device_init_s", "weights_s",
               "compile_s", "kv_profile_s", "graph_capture_s", "kernel_jit_s", "api_ready_s", "first_request_s")
_ZONE_STEP_S = 900  # time zones are whole quarter hours apart
_AGREE_S = 60.0  # the log's first line and the log's first byte, seen by the timer, are this close


def _stamp_time(stamp: str, start_local: datetime) -> float:
    """``MM-DD HH:MM:SS.mmm`` (the year is the start's, or the next one across New Year) in seconds
    after ``start_local``."""
    when = datetime.strptime(f"{start_local.year}-{stamp}", "%Y-%m-%d %H:%M:%S.%f")
    if (start_local - when).days > 180:
        when = when.replace(year=start_local.year + 1)
    return (when - start_local).total_seconds()


def log_clock(log: Mapping[str, Any], timings: Mapping[str, Any]) -> tuple[Any, str]:
    """A function from a log stamp to seconds after the start command, or None, and a note.

    The log is in the engine's local time: the timer's ``clock.utc_offset_s`` converts it. When
    the log's first line and the first byte the timer saw disagree by whole quarter hours (an
    engine in a container with another time zone), the log's clock is shifted by that much."""
    started = timings.get("started_at")
    offset = (timings.get("clock") or {}).get("utc_offset_s")
    first = log.get("first_ts")
    if started is None or offset is None or not first:
        return None, "" if not first else "no clock mapping in timings.json: log phases are not placed in time"
    start_local = datetime.fromtimestamp(float(started) + float(offset), tz=UTC).replace(tzinfo=None)
    shift = 0.0
    first_s = _stamp_time(str(first), start_local)
    events = timings.get("events") or {}
    seen = events.get("log_first_byte")
    note = ""
    last = events.get("first_token", timings.get("first_token_s"))
    if seen is None and last is not None and not -_AGREE_S <= first_s <= float(last) + _AGREE_S:
        return None, (f"the log's first line is {first_s:+.0f} s from the start command (its clock disagrees with "
                      "the timer's): log phases are not placed in time")
    if seen is not None and abs(float(seen) - first_s) > _AGREE_S:
        shift = round((float(seen) - first_s) / _ZONE_STEP_S) * _ZONE_STEP_S
        if abs(float(seen) - first_s - shift) > _AGREE_S:
            return None, (f"the log's clock disagrees with the timer's by {first_s - float(seen):+.0f} s: "
                          "log phases are not placed in time")
        note = f"log clock {-shift / 3600:+g} h from the timer's (another time zone): shifted"

    def to_seconds(stamp: str) -> float:
        return _stamp_time(stamp, start_local) + shift

    return to_seconds, note


def _engine_process_start(timings: Mapping[str, Any]) -> float | None:
    starts = [float(p["start_s"]) for p in timings.get("processes") or []
              if p.get("role") == "engine_core" and p.get("start_s") is not None]
    return min(starts) if starts else None


def _log_anchors(log: Mapping[str, Any], to_seconds: Any, half: float
                 ) -> tuple[dict[str, float], dict[str, tuple[str, float]]]:
    """Boundaries the log gives, in seconds after the start (a whole-second stamp at its middle),
    and the phases whose duration a line states: their start boundary -> (end boundary, seconds)."""
    stamps = log.get("phase_ts") or {}

    def at(*names: str) -> float | None:
        for name in names:
            if stamps.get(name):
                return float(to_seconds(stamps[name])) + half
        return None

    out: dict[str, float | None] = {
        "api_first": float(to_seconds(log["first_ts"])) + half,
        "api_config": at("api_config"),
        "engine_first": at("engine_core_start", "engine_init_start"),
        "kv_end": at("kv_cache_size", "available_kv_cache"),
        "engine_ready": at("init_engine", "jit_monitor"),
        "api_ready": at("api_server_ready"),
    }
    stated: dict[str, tuple[str, float]] = {}
    for end, start, stamp_names, duration_keys in (
            ("weights_end", "weights_start", ("model_load", "weights_load"), ("model_load_s", "weights_load_s")),
            ("compile_end", "compile_start", ("compile",), ("compile_s",)),
            ("graph_end", "graph_start", ("graph_capture",), ("graph_capture_s",))):
        for stamp_name, key in zip(stamp_names, duration_keys, strict=True):
            if stamps.get(stamp_name) and log.get(key) is not None:
                out[end] = float(to_seconds(stamps[stamp_name])) + half
                out[start] = out[end] - float(log[key])  # type: ignore[operator]
                stated[start] = (end, float(log[key]))
                break
    return {k: v for k, v in out.items() if v is not None}, stated


def _ordered(anchors: dict[str, float], windows: dict[str, tuple[float, float]],
             stated: dict[str, tuple[str, float]], first_token_s: float) -> dict[str, float]:
    """Boundary times in order. A boundary is moved, within its window (the second of its stamp;
    none for a timer event), before a later one that is known to be earlier (the port opened
    before the middle of the second "init engine" was logged in); then each boundary is kept no
    earlier than the one before it and no later than the first token. A phase whose duration its
    line states keeps it where the stamp's second allows: its end moves later within that second
    rather than the phase shrinking."""
    names = [name for name in ANCHORS if name in anchors]
    t = dict(anchors)
    for i in range(len(names) - 2, -1, -1):
        name = names[i]
        t[name] = max(windows[name][0], min(t[name], t[names[i + 1]]))
    out: dict[str, float] = {}
    last = 0.0
    for name in names:
        if name in out:
            continue
        if name in stated:
            end, seconds = stated[name]
            t[end] = min(max(t[end], last + seconds), windows[end][1])
            out[name] = min(max(t[end] - seconds, last), first_token_s)
        else:
            out[name] = min(max(t[name], last), first_token_s)
        last = out[name]
    return out


def _boundaries(first_token_s: float, log: Mapping[str, Any],
                timings: Mapping[str, Any]) -> tuple[dict[str, float], list[str], float, str]:
    """Every boundary's time in seconds after the start command, the sources, the resolution and a note."""
    events = timings.get("events") or {}
    poll_s = float(timings.get("poll_s") or 0.0)
    anchors: dict[str, float] = {"start": 0.0, "first_token": float(first_token_s)}
    sources = ["timer"]
    to_seconds, note = log_clock(log, timings)
    resolution = 0.001 if log.get("ts_has_ms") else 1.0
    half = 0.0 if log.get("ts_has_ms") else 0.5  # a whole-second stamp stands for the middle of its second
    stated: dict[str, tuple[str, float]] = {}
    log_names: set[str] = set()
    if to_seconds is not None:
        from_log, stated = _log_anchors(log, to_seconds, half)
        anchors.update(from_log)
        log_names = set(from_log)
        sources.append("log")
        seen = events.get("log_first_byte")
        floor = anchors["api_first"] - half
        if seen is not None and floor <= float(seen) <= floor + resolution + poll_s:
            anchors["api_first"] = float(seen)  # the timer saw the first line arrive
            log_names.discard("api_first")
    process = _engine_process_start(timings)
    if process is not None:
        anchors["engine_process"] = process
        sources.append("proc")
    if events.get("port_open") is not None:
        anchors["api_ready"] = float(events["port_open"])
        log_names.discard("api_ready")
    windows = {name: (at - half, at + half) if name in log_names else (at, at) for name, at in anchors.items()}
    times = _ordered(anchors, windows, stated, float(first_token_s))
    resolution = resolution if "log" in sources else max(poll_s, 0.001)
    return times, sources, resolution, note


def boundaries(first_token_s: float, log: Mapping[str, Any], timings: Mapping[str, Any]) -> dict[str, float]:
    """Each boundary of :data:`ANCHORS` that the start passed, in seconds after the start command."""
    return _boundaries(first_token_s, log, timings)[0]


def timeline(first_token_s: float, log: Mapping[str, Any], timings: Mapping[str, Any]) -> dict[str, Any]:
    """The phases of one start (see the module docstring), ``other_s``, ``named_fraction``,
    ``timeline_resolution_s``, ``timeline_sources`` and, when the log could not be placed or
    was shifted, ``timeline_note``."""
    times, sources, resolution, note = _boundaries(first_token_s, log, timings)
    present = [name for name in ANCHORS if name in times]
    out: dict[str, Any] = {}
    for phase, end, starts in PHASES:
        if end not in times or end == present[0]:
            continue
        start = present[present.index(end) - 1]
        if start in starts:
            out[phase] = round(out.get(phase, 0.0) + times[end] - times[start], 3)
    named = sum(out.values())
    out["other_s"] = round(max(0.0, float(first_token_s) - named), 3)
    out["named_fraction"] = round(min(1.0, named / float(first_token_s)), 4) if first_token_s > 0 else None
    out["timeline_resolution_s"] = resolution
    out["timeline_sources"] = "+".join(sources)
    if note:
        out["timeline_note"] = note
    return out
