"""Parse a vLLM server log into startup phases, periodic stats and error labels.

The parser reads a log as a stream of lines (memory stays flat whatever the size) and is
tolerant of the format drift between vLLM versions: ``took``/``takes``, ``GiB memory``/``GiB``/
old ``GB``, merged or separate KV-capacity lines, thousands separators, V0 and V1 stats lines
(including the DEBUG ones logged when idle), every era of line prefix (``[file.py:N]``,
``file.py:N]``, none; process prefixes such as ``(EngineCore_DP0 pid=1)``, nested
``(APIServer pid=1) (EngineCore pid=7)``), ANSI colour codes, ``\\r``-separated progress bars and
optional milliseconds in timestamps. A log-collector wrapper around each line (``kubectl``, CRI
log files, ``journalctl``, ``docker compose logs``, ``docker logs -t``, Cloud Logging JSON) is
detected from the first lines and stripped (:mod:`runner.parse.log_wrappers`); ``wrapper``
names it (``"none"`` for a bare log). Whatever else precedes vLLM's line (a console's text export,
a kernel log's stamp, a line shipper's timestamp, a mix of formats) is skipped too: the prefix is
looked for where :func:`~runner.parse.log_wrappers.vllm_line_start` says vLLM's line begins.

Output rules (see :func:`parse_log_text`):

* A measurement key is present only when its line was found; an absent line means the key is
  omitted, never ``0`` or ``None``. ``wrapper``, ``stats``, ``stats_count``, ``errors`` and
  ``missing`` are always present (an empty list / zero count is a fact, not a missing
  measurement).
* With TP>1 (or several DP engines) the startup lines repeat once per worker. Durations and
  memory sizes take the **maximum** across workers (the slowest worker gates startup);
  capacities (``available_kv_cache_gib``, ``kv_cache_tokens``, ``max_concurrency``) take the
  **minimum** (the smallest worker bounds the engine, as vLLM itself does).
  ``inductor_compile_s`` and ``compile_cache_load_s`` sum the ``Compiling a graph ... takes``
  and ``Directly load ... took`` lines per process (one per graph), then take the maximum
  over processes.
* Sleep/wake values are those of the **last** cycle; ``sleep_events`` lists every cycle.
* ``phase_ts`` maps a phase to the timestamp (``"MM-DD HH:MM:SS.mmm"``) of the **last** line
  of that phase (the slowest worker), except ``shutdown`` which is the first shutdown line,
  ``engine_core_start`` (the first timestamped line of the EngineCore process, from its
  ``(EngineCore...)`` prefix) and ``api_config`` (the last timestamped line before the
  EngineCore's first output: where the API server's config resolution ends). The last two are
  found by one ``bytes.find`` per chunk until the EngineCore's first line, a log without
  process prefixes has neither.
  When the log has no milliseconds, ``.000`` is appended and ``ts_has_ms`` is ``False``.
* ``compile_cache_hit`` is ``True`` when any ``Directly load ...`` line is seen (compiled
  graph loaded from the cache, or AOT compilation loaded from a path), ``False`` when a
  ``Compiling a graph for ... takes`` line is seen and no hit, omitted otherwise.
* The hit rates in ``stats`` are vLLM's own, token-weighted over the **most recent 1000
  requests** (hence ``prefix_hit_pct_rolling1000``); V0 logs report a block-level rate since
  start (``gpu_prefix_hit_pct_v0``). Neither is a per-run rate: use the ``/metrics`` counter
  deltas in :mod:`runner.parse.metrics` for that.
* Bounds: ``stats`` and ``sleep_events`` keep the **last** :data:`MAX_ITEMS` entries
  (``stats_count`` counts every stats line); a line longer than :data:`LINE_MAX` bytes is cut
  to that length; per-process compile sums track at most :data:`MAX_PROCESSES` processes (the
  others share one sum). ``truncated`` (present only when something was cut) counts what was
  dropped: ``stats``, ``sleep_events`` (entries), ``long_lines``, ``processes`` (lines whose
  process was not tracked apart).

Keys, in output order: ``wrapper``, ``first_ts``, ``last_ts``, ``ts_has_ms``, ``vllm_version``,
``model``, ``tensor_parallel_size``, ``enforce_eager`` (from the engine config / args / eager
messages), ``weights_load_s``, ``model_load_s``, ``model_load_gib``, ``compile_cache_dir``
(first one, rank 0), ``compile_cache_disabled``, ``dynamo_transform_s``, ``compile_cache_hit``,
``inductor_compile_s``, ``compile_cache_load_s``, ``compile_s``, ``profile_warmup_s``,
``memory_profiling_s``, ``available_kv_cache_gib``, ``kv_cache_tokens``, ``gpu_blocks`` /
``cpu_blocks`` (V0), ``max_concurrency``, ``max_concurrency_req_tokens``, ``graph_capture_s``
(integer seconds as logged; use ``phase_ts``), ``graph_capture_gib``, ``init_engine_s``,
``init_engine_compilation_s``, ``api_server_ready``, ``sleep_s``, ``wake_s``, ``wake_tags``,
``sleep_freed_gib``, ``sleep_still_in_use_gib``, ``sleep_events``, ``stats``, ``stats_count``,
``last_prefix_cache_hit_pct`` (last stats line that has one; V0's GPU rate counts),
``last_external_prefix_cache_hit_pct``, ``shutdown_seen``, ``phase_ts``, ``errors``,
``errors_after_shutdown``, ``missing``, ``truncated``.

A ``stats`` entry has ``ts``, ``engine`` (``"000"``, ``"001"``..., ``"aggregated"``; absent on
V0 and early V1 lines), ``prompt_tput_tok_s``, ``gen_tput_tok_s``, ``running_reqs``,
``waiting_reqs`` (V0 ``Pending``), ``kv_usage_pct``, ``prefix_hit_pct_rolling1000``, and when
logged ``external_prefix_hit_pct_rolling1000``, ``swapped_reqs``, ``deferred_reqs``,
``preemptions``, ``corrupted_reqs``, ``cpu_kv_usage_pct``, ``mm_cache_hit_pct_rolling``,
``gpu_prefix_hit_pct_v0``, ``cpu_prefix_hit_pct_v0``.

``phase_ts`` names: ``non_default_args``, ``api_config``, ``engine_core_start``,
``engine_init_start``, ``weights_load``,
``model_load``, ``compile_cache_dir``, ``dynamo_transform``, ``inductor_compile``,
``compile_cache_load``, ``compile``, ``profile_warmup``, ``memory_profiling``,
``available_kv_cache``, ``kv_cache_size``, ``graph_capture``, ``jit_monitor`` (vLLM 0.24: the
gap from ``graph_capture`` to it is kernel JIT, not torch.compile), ``init_engine``,
``api_server_ready``, ``sleep``, ``wake``, ``shutdown``.

Error labels (``errors``, sorted, unique): ``worker_died``, ``engine_core_died``,
``cuda_oom``, ``kv_spec_unify``, ``engine_core_failed`` (initialisation failed),
``engine_core_fatal`` (a runtime ``EngineCore encountered a fatal error``), ``engine_dead``,
``kv_cache_insufficient``, ``oom_killer`` (kernel OOM-killer lines), ``cuda_error``,
``nccl_error``, ``port_in_use``. Errors logged after the first shutdown line (``[shutdown]``,
uvicorn ``Shutting down``) go to ``errors_after_shutdown`` instead: a stop that the runner
asked for makes vLLM log ``EngineDeadError`` and friends, which are not failures. Request-log
lines (``Received request ...``) are never scanned for errors, since they carry user text.

``missing`` (only when the log shows a server start, i.e. a ``non-default args``, engine
config, version, weight-load, KV-cache, compile or init-engine line): the expected startup
lines that were not found, among ``weights_load_s``, ``model_load_s``, ``compile``
(satisfied by ``compile_s``, by enforce-eager evidence, or by a V0 engine, which has no
torch.compile step), ``graph_capture_s`` (not expected under enforce-eager: ``'enforce_eager':
True`` in ``non-default args``, ``enforce_eager=True`` in the engine config, ``Enforce eager
set`` or ``Cudagraph is disabled under eager mode``), ``init_engine_s``, ``kv_cache_tokens``
(satisfied by V0's ``# GPU blocks`` line) and ``api_server_ready``. A start that died early lists
every later phase as missing; the ``errors`` labels say why.

A text is a vLLM log when at least one line carries vLLM's prefix (level and ``MM-DD
HH:MM:SS`` timestamp), a known vLLM message or a kernel OOM-killer line is found (a node's kernel
log is read for ``oom_killer`` alone); otherwise :class:`ParseError` is raised. One server start
per log is assumed (a file appended across restarts mixes them).

Input (:func:`parse_log_file`): a regular file, plain or gzip-compressed (magic bytes), read in
chunks of whole lines. A FIFO, device, socket or directory is refused before any read, binary
data and a gzip stream that inflates past :data:`MAX_GUNZIP_BYTES` (environment variable
``RUNNER_LOG_MAX_GUNZIP_BYTES``) or, past its first :data:`GUNZIP_RATIO_FLOOR` bytes, to more than
:data:`MAX_GUNZIP_RATIO` times the compressed bytes read so far (``RUNNER_LOG_MAX_GUNZIP_RATIO``:
a gzip bomb is refused within a second, not after minutes of parsing) are refused while reading
(:class:`LogInputError`); bytes that are not UTF-8 are replaced, not fatal.

Speed: a line is looked at only when it holds a keyword (words of the messages handled, so that
a prompt saying "took" in a request log is not one). The keywords are found per chunk in two
passes: ``bytes.translate`` turns every *pivot* byte (a few bytes, one of them in each keyword)
into ``\\x01``, then one regex that starts with that literal byte (the fastest scan ``re`` has)
checks the keywords, translated the same way, at each one; only those lines are decoded, unwrapped
and go through the prefix and message regexes. After the first shutdown line the shutdown keywords
are dropped (later ones cannot change the record). First and last timestamps come from a few lines
at each end of a chunk, else from a scan for the ``HH:MM:SS`` shape. ANSI codes are assumed not to
split a message keyword or a timestamp (vLLM and docker colour the level and prefixes, not messages).
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import re
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from runner.errors import LogInputError, ParseError
from runner.files import NotRegularFile, open_regular
from runner.parse.log_wrappers import NONE, Wrapper, detect, rejoin_cri, vllm_line_start

__all__ = [
    "ERROR_LABELS",
    "EXPECTED_STARTUP",
    "LINE_MAX",
    "MAX_GUNZIP_BYTES",
    "MAX_GUNZIP_RATIO",
    "MAX_ITEMS",
    "MAX_PROCESSES",
    "parse_log_file",
    "parse_log_if_any",
    "parse_log_text",
]

log = logging.getLogger(__name__)

LINE_MAX = 64 * 1024  # bytes of one line that are parsed; the rest of a longer line is dropped
MAX_ITEMS = 10_000  # stats lines and sleep/wake events kept (the most recent ones)
MAX_PROCESSES = 1024  # processes whose compile times are summed apart
MAX_GUNZIP_BYTES = 4 << 30  # decompressed size at which a gzip input is refused
GUNZIP_LIMIT_ENV = "RUNNER_LOG_MAX_GUNZIP_BYTES"
# Decompressed bytes per compressed byte read at which a gzip input is refused. vLLM logs deflate
# 6-8x (startups), ~25x (serving), ~85x (idle, DEBUG stats every 10 s); repeated lines ~300x, a
# bomb up to ~1000x. Checked once GUNZIP_RATIO_FLOOR bytes are out, so a small log never is.
MAX_GUNZIP_RATIO = 200
GUNZIP_RATIO_ENV = "RUNNER_LOG_MAX_GUNZIP_RATIO"
GUNZIP_RATIO_FLOOR = 16 << 20
_CHUNK = 1 << 20  # bytes read at a time (whole lines are parsed, the partial last one waits)
_SNIFF = 64 * 1024  # bytes at the start where a NUL byte means binary data
_DETECT_LINES = 64  # lines at the start from which the wrapper is detected

# ----------------------------------------------------------------------------------------------
# Line prefix and candidate selection

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

# vLLM's own line prefix: "(PROCESS pid=N) ... LEVEL MM-DD HH:MM:SS [file.py:N] ". Whatever a
# collector put before it (a wrapper that was not detected, a format of its own) is skipped by
# :func:`_vllm_prefix`, which looks for it where :func:`vllm_line_start` says vLLM's line begins.
# Possessive repeats (``*+``, ``++``): each is followed by a byte it cannot match, so giving bytes
# back could never make the rest match; not keeping the places to go back to is a fifth of the work.
_PREFIX = re.compile(
    r"(?:\((?P<proc>[A-Za-z_][^()]*+)\)[ \t]*+)*+"  # (APIServer pid=1) (EngineCore pid=7)
    r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)[ \t]++"
    r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d++)?)[ \t]++"
    r"(?:\[?[\w.<>/-]++:\d++\][ \t]*+)?"  # [core.py:123] / core.py:123] / nothing
)


_match_prefix = _PREFIX.match


def _vllm_prefix(line: str) -> re.Match[str] | None:
    """vLLM's prefix at the start of ``line`` (the common case, one ``match``) or wherever vLLM's line
    begins in it (:meth:`_Collector.feed` does the same inline)."""
    m = _match_prefix(line)
    if m is None:
        start = vllm_line_start(line)
        if start > 0:
            m = _match_prefix(line, start)
    return m


_PID = re.compile(r"pid=(\d+)")

# Literal keywords: a line is looked at only when it contains one of them. Every message
# handled below and every error pattern must contain at least one keyword (a literal that is
# part of every line it accepts); tests check that each fixture line a handler takes holds one.
_KEYWORDS = (
    # startup, sleep/wake, stats, readiness (message words, not bare "took": prompts in request
    # logs say "took" too)
    "Loading weights took", "Loading model weights took", "Model loading took", "torch.compile took",
    "torch.compile takes", ") took", "It took", "KV cache size", "blocks: ", "Dynamo bytecode", "Directly load",
    "vLLM's torch.compile",
    "Graph capturing finished", "Compiling a graph for", "Initial profiling", "Memory profiling",
    "Available KV cache memory", "Maximum concurrency for", "Sleep mode freed", "Avg prompt throughput",
    "Prefix cache hit rate: GPU", "Starting vLLM", "Available routes", "Application startup complete",
    "non-default args", "LLM engine", "API server version", "Cudagraph is disabled", "Enforce eager",
    "Kernel JIT monitor", "[shutdown]", "Shutting down",
    # errors
    "out of memory", "Out of memory", "OutOfMemory", "oom-kill", "oom_reaper", "Worker proc", "Worker Proc",
    "WorkerProc", "Workerproc", "Engine core proc", "Engine Core proc", "EngineCore proc", "Enginecore proc",
    "unified type", "initialization failed", "failed to start", "fatal error", "EngineDead", "already dead",
    "available KV cache memory", "No available memory", "CUDA error", "NCCL error", "already in use",
)  # fmt: skip
# Pivot bytes: every keyword holds at least one. A chunk is translated so that each pivot byte reads
# \x01 (and a \x01 of the text \x02); one regex scan then stops at each \x01 and looks for the keywords,
# translated the same way, around it. A translation and a scan for one literal byte are the fastest
# passes over bytes that Python has: one of each finds every keyword, where a scan per pivot byte took
# seven passes and four ``bytes.find`` more (a third more instructions in all). These pivots cover
# every keyword with the fewest stops in vLLM logs ("o" is frequent, but it is in most keywords, and
# the byte after it tells them apart at once). A translated keyword may match other text whose pivot
# bytes differ (a line more to read, never one less): the handlers decide.
_PIVOTS = b"VDLGbyoJ"
_PIVOT_TABLE = bytes(1 if byte in _PIVOTS else 2 if byte == 1 else byte for byte in range(256))

_SHUTDOWN_KEYWORDS = ("[shutdown]", "Shutting down")  # no use once the first shutdown line is seen


def _tails_regex(tails: list[tuple[bytes, bytes]]) -> bytes:
    """A regex for the keywords' ``(tail, look-back)`` pairs after their pivot, common heads shared (a
    trie: at a stop, one byte rules most branches out). The look-back checks the whole keyword, before
    the pivot too; a keyword that starts at its pivot has none and matches on its tail alone."""
    heads: dict[bytes, list[tuple[bytes, bytes]]] = {}
    checks: set[bytes] = set()
    for tail, check in tails:
        if not tail and not check:
            return b""  # a whole keyword matched here
        if tail:
            heads.setdefault(tail[:1], []).append((tail[1:], check))
        else:
            checks.add(check)
    alts = [re.escape(head) + _tails_regex(rest) for head, rest in sorted(heads.items())] + sorted(checks)
    return alts[0] if len(alts) == 1 else b"(?:" + b"|".join(alts) + b")"


def _keyword_regex(skip: tuple[str, ...] = ()) -> re.Pattern[bytes]:
    """One regex, run on a chunk translated by :data:`_PIVOT_TABLE`, that matches from a keyword's pivot
    to the end of its line."""
    tails = []
    for word in _KEYWORDS:
        if word in skip:
            continue
        translated = word.encode().translate(_PIVOT_TABLE)
        pivot = translated.find(1)
        if pivot < 0:
            raise ValueError(f"keyword {word!r} holds none of the pivot bytes {_PIVOTS!r}")
        check = b"(?<=" + re.escape(translated) + b")" if pivot else b""
        tails.append((translated[pivot + 1 :], check))
    return re.compile(b"\x01" + _tails_regex(tails) + b"[^\n]*")


_KW_REGEX = _keyword_regex()
_KW_FIND = _KW_REGEX.finditer
_KW_FIND_AFTER_SHUTDOWN = _keyword_regex(_SHUTDOWN_KEYWORDS).finditer
_LINE_SPLIT = re.compile(r"[\r\n]")

# Messages recognised in lines without vLLM's prefix (custom logging formats, uvicorn).
_KNOWN_MSG = re.compile(
    r"Loading weights took|Loading model weights took|Model loading took|torch\.compile t|"
    r"Dynamo bytecode|Directly load|Compiling a graph for|Using cache directory|"
    r"init engine \(|Initial profiling|Memory profiling|Available KV cache memory|GPU KV cache size|"
    r"Maximum concurrency for|# (?:GPU|cuda|gpu) blocks|Graph capturing finished|It took [\d.]+ seconds to|"
    r"Sleep mode freed|Engine \d+: Avg|\d+ Engines Aggregated:|Avg prompt throughput|"
    r"Prefix cache hit rate: GPU|Starting vLLM|Available routes are|Application startup complete|"
    r"Shutting down|non-default args|Initializing an? (?:V1 )?LLM engine|vLLM API server version|"
    r"Cudagraph is disabled|Enforce eager set|Kernel JIT monitor"
)
# Messages from uvicorn/starlette: handled, but not evidence that the text is a vLLM log.
_GENERIC_WORDS = frozenset({"Application", "Shutting"})

_REQUEST_LOG = ("Received request", "Added request", "Finished request", "Aborted request",
                "Generated response")  # fmt: skip

# ----------------------------------------------------------------------------------------------
# Message regexes (matched at the start of the message)

_RE_WEIGHTS = re.compile(r"Loading weights took ([\d.]+) s")
_RE_OLD_WEIGHTS = re.compile(r"Loading model weights took ([\d.]+) GB")
_RE_MODEL_LOAD = re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) s")
_RE_COMPILE_TOTAL = re.compile(r"torch\.compile (?:took|takes) ([\d.]+) s in total")
_RE_COMPILE_OFF = re.compile(r"vLLM's torch\.compile cache is disabled")
_RE_DYNAMO = re.compile(r"Dynamo bytecode transform time: ([\d.]+) s")
_RE_DIRECT = re.compile(r"Directly load (?:the compiled graph|AOT compilation)")
_RE_TOOK_S = re.compile(r"took ([\d.]+) s")
_RE_COMPILING = re.compile(r"Compiling a graph for .*? takes ([\d.]+) s")
_RE_CACHE_DIR = re.compile(r"Using cache directory: (.+?) for vLLM's torch\.compile")
_RE_INIT_ENGINE = re.compile(
    r"init engine \([^)]*\) took ([\d.]+) s(?:econds)?"  # "(profile, create kv cache, warmup model)"
    r"(?: \(compilation: ([\d.]+) s\))?"  # newer builds add the compile share
)
_RE_PROFILE_WARMUP = re.compile(r"Initial profiling/warmup run took ([\d.]+) s")
_RE_MEM_PROFILING = re.compile(r"Memory profiling (?:takes ([\d.]+) seconds|results: .*?duration=([\d.]+) s)")
_RE_AVAIL_KV = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_RE_KV_SIZE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_RE_MAX_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_RE_BLOCKS = re.compile(r"# (?:GPU|cuda|gpu) blocks: (\d+), # CPU blocks: (\d+)")
_RE_GRAPH = re.compile(r"Graph capturing finished in ([\d.]+) secs?(?:, took ([\d.]+) GiB)?")
_RE_SLEEP = re.compile(r"It took ([\d.]+) seconds to fall asleep")
_RE_WAKE = re.compile(r"It took ([\d.]+) seconds to wake up(?: tags (.*))?")
_RE_QUOTED = re.compile(r"'([^']*)'|\"([^\"]*)\"")
_RE_SLEEP_FREED = re.compile(r"Sleep mode freed ([\d.]+) GiB memory, ([\d.]+) GiB memory is still in use")
# Greedy is the same match as lazy here (':' is not a key character), and faster; bounded so that a
# hostile run of letters is not scanned once per capital.
_RE_STATS_FIELD = re.compile(r"([A-Z][A-Za-z ]{0,63}): (\d+(?:\.\d+)?)")
_RE_ENGINE_PREFIX = re.compile(r"(?:Engine (\d+)|(\d+) Engines Aggregated):[ \t]*")
# The V1 stats line as vLLM 0.8-0.24 write it, read in one match (the most frequent line of a serving
# log); the fields after it, and any other shape, go through _RE_STATS_FIELD as before.
_NUM = r"(\d++(?:\.\d++)?)"  # possessive, as in _PREFIX: a digit never follows a number
_RE_STATS_V1 = re.compile(
    rf"(?:Engine (\d++):[ \t]*+)?Avg prompt throughput: {_NUM} tokens/s, Avg generation throughput: {_NUM} "
    r"tokens/s, Running: (\d++) reqs, Waiting: (\d++) reqs(?:, Deferred: (\d++) reqs)?, "
    rf"GPU KV cache usage: {_NUM}%, Prefix cache hit rate: {_NUM}%(?:, External prefix cache hit rate: {_NUM}%)?"
)
_RE_V0_PREFIX_HIT = re.compile(r"Prefix cache hit rate: GPU: ([\d.]+)%, CPU: ([\d.]+)%")
_RE_API_READY = re.compile(r"Starting vLLM (?:API )?server|Available routes are|Application startup complete")
_RE_ENGINE_CONFIG = re.compile(r"Initializing an? (?:V1 )?LLM engine \(v?([^)\s]+)\) with config:")
_RE_SERVER_VERSION = re.compile(r"vLLM API server version (\S+)")
_RE_CFG_EAGER = re.compile(r"enforce_eager=(True|False)")
_RE_CFG_TP = re.compile(r"tensor_parallel_size=(\d+)")
_RE_CFG_MODEL = re.compile(r"model='([^']*)'")
_RE_ARGS_EAGER = re.compile(r"'enforce_eager': (True|False)")
_RE_EAGER_MSG = re.compile(r"Cudagraph is disabled under eager mode|Enforce eager set")

# Output key of the newest hit rate → the stats fields it is read from, preferred first.
_LAST_HIT_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("last_prefix_cache_hit_pct", ("prefix_hit_pct_rolling1000", "gpu_prefix_hit_pct_v0")),
    ("last_external_prefix_cache_hit_pct", ("external_prefix_hit_pct_rolling1000",)),
)

# Stats fields ("Key: value" parts of a stats line) → (output key, type).
_STATS_FIELDS: dict[str, tuple[str, type]] = {
    "Avg prompt throughput": ("prompt_tput_tok_s", float),
    "Avg generation throughput": ("gen_tput_tok_s", float),
    "Running": ("running_reqs", int),
    "Waiting": ("waiting_reqs", int),
    "Pending": ("waiting_reqs", int),  # V0 name for waiting
    "Swapped": ("swapped_reqs", int),
    "Deferred": ("deferred_reqs", int),
    "Preemptions": ("preemptions", int),
    "Corrupted": ("corrupted_reqs", int),
    "GPU KV cache usage": ("kv_usage_pct", float),
    "CPU KV cache usage": ("cpu_kv_usage_pct", float),
    "Prefix cache hit rate": ("prefix_hit_pct_rolling1000", float),
    "External prefix cache hit rate": ("external_prefix_hit_pct_rolling1000", float),
    "MM cache hit rate": ("mm_cache_hit_pct_rolling", float),
}

# ----------------------------------------------------------------------------------------------
# Errors

_ERROR_PATTERNS: tuple[tuple[str, str], ...] = (
    ("cuda_oom", r"CUDA out of memory|OutOfMemoryError"),
    ("oom_killer", r"Out of memory: Kill|oom-kill|oom_reaper"),
    ("worker_died", r"Worker ?[Pp]roc(?:ess)?\b.{0,200}?\bdied\b"),  # bounded: no quadratic scan of a long line
    ("engine_core_died", r"Engine ?[Cc]ore proc \S{1,200} died"),
    ("kv_spec_unify", r"KV cache specs? to one unified type"),
    ("engine_core_failed", r"Engine core initialization failed|EngineCore failed to start"),
    ("engine_core_fatal", r"EngineCore encountered a fatal error"),
    ("engine_dead", r"EngineDeadError|MQLLMEngine is already dead"),
    ("kv_cache_insufficient",
     r"No available memory for the cache blocks|larger than the available KV cache memory"),
    ("cuda_error", r"CUDA error: "),
    ("nccl_error", r"NCCL error"),
    ("port_in_use", r"[Aa]ddress already in use"),
)  # fmt: skip
ERROR_LABELS: tuple[str, ...] = tuple(sorted(label for label, _ in _ERROR_PATTERNS))
# Literals of which every match of a label's pattern holds one: the regex runs only then.
_ERROR_LITERALS: dict[str, tuple[str, ...]] = {
    "cuda_oom": ("out of memory", "OutOfMemoryError"),
    "oom_killer": ("Out of memory", "oom-kill", "oom_reaper"),
    "worker_died": ("Worker",),
    "engine_core_died": ("ore proc",),
    "kv_spec_unify": ("unified type",),
    "engine_core_failed": ("initialization failed", "failed to start"),
    "engine_core_fatal": ("fatal error",),
    "engine_dead": ("EngineDeadError", "already dead"),
    "kv_cache_insufficient": ("No available memory", "available KV cache memory"),
    "cuda_error": ("CUDA error: ",),
    "nccl_error": ("NCCL error",),
    "port_in_use": ("ddress already in use",),
}
_ERRORS: tuple[tuple[str, str, Callable[[str], Any]], ...] = tuple(
    (literal, label, re.compile(pattern).search)
    for label, pattern in _ERROR_PATTERNS
    for literal in _ERROR_LITERALS[label]
)

EXPECTED_STARTUP: tuple[str, ...] = (
    "weights_load_s",
    "model_load_s",
    "compile",
    "graph_capture_s",
    "init_engine_s",
    "kv_cache_tokens",
    "api_server_ready",
)


def _norm_ts(ts: str) -> str:
    """``MM-DD HH:MM:SS[.f]`` or ``MM-DD HH:MM:SS,f`` → ``MM-DD HH:MM:SS.mmm``."""
    if len(ts) <= 14:
        return ts + ".000"
    return f"{ts[:14]}.{(ts[15:] + '000')[:3]}"


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _stats_fields(msg: str, ts: str | None) -> dict[str, Any] | None:
    """A stats line read field by field ("Key: value" parts), any version; ``None`` if it is not one."""
    entry: dict[str, Any] = {}
    body = msg
    pm = _RE_ENGINE_PREFIX.match(msg)
    if pm is not None:
        entry["engine"] = pm.group(1) if pm.group(1) is not None else "aggregated"
        body = msg[pm.end() :]
    if not body.startswith("Avg prompt throughput"):
        return None
    if ts is not None:
        entry["ts"] = ts
    _add_fields(entry, body)
    return entry


def _add_fields(entry: dict[str, Any], text: str) -> None:
    get = _STATS_FIELDS.get
    for key, value in _RE_STATS_FIELD.findall(text):
        spec = get(key)
        if spec is not None:
            try:
                entry[spec[0]] = spec[1](value)
            except ValueError:  # e.g. "1.0" for an int field
                entry[spec[0]] = spec[1](float(value))


def _stats_v1(msg: str, ts: str | None) -> dict[str, Any] | None:
    """The common V1 stats line in one match: the same entry as :func:`_stats_fields`, faster."""
    m = _RE_STATS_V1.match(msg)
    if m is None:
        return None
    engine, prompt, gen, running, waiting, deferred, kv, hit, external = m.groups()
    entry: dict[str, Any] = {} if engine is None else {"engine": engine}
    if ts is not None:
        entry["ts"] = ts
    entry["prompt_tput_tok_s"] = float(prompt)
    entry["gen_tput_tok_s"] = float(gen)
    entry["running_reqs"] = int(running)
    entry["waiting_reqs"] = int(waiting)
    if deferred is not None:
        entry["deferred_reqs"] = int(deferred)
    entry["kv_usage_pct"] = float(kv)
    entry["prefix_hit_pct_rolling1000"] = float(hit)
    if external is not None:
        entry["external_prefix_hit_pct_rolling1000"] = float(external)
    if m.end() < len(msg):
        _add_fields(entry, msg[m.end() :])
    return entry


Handler = Callable[[str, str | None, str | None], bool]
Strip = Callable[[str], str | None]  # a wrapper's line stripper (see runner.parse.log_wrappers)


class _Collector:
    """Accumulates what the handlers find; :meth:`result` builds the output dict."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.first: dict[str, Any] = {}
        self.last: dict[str, Any] = {}
        self.phase_ts: dict[str, str] = {}
        self.per_proc: dict[str, dict[str, float]] = {"inductor_compile_s": {}, "compile_cache_load_s": {}}
        self.stats: deque[dict[str, Any]] = deque(maxlen=MAX_ITEMS)
        self.stats_seen = 0
        self.sleep_events: deque[dict[str, Any]] = deque(maxlen=MAX_ITEMS)
        self.sleep_seen = 0
        self.last_hit: dict[str, float] = {}  # last_*_prefix_cache_hit_pct, kept as lines come
        self.truncated: dict[str, int] = {"stats": 0, "sleep_events": 0, "long_lines": 0, "processes": 0}
        self.errors: set[str] = set()
        self.errors_after_shutdown: set[str] = set()
        self.compile_hit = False
        self.compile_miss = False
        self.eager: bool | None = None
        self.v0_engine = False
        self.startup_seen = False
        self.api_ready = False
        self.shutdown = False
        self.evidence = 0
        self.dispatch: dict[str, Handler] = {
            "Loading": self._loading,
            "Model": self._model_loading,
            "torch.compile": self._compile_total,
            "vLLM's": self._compile_off,
            "Dynamo": self._dynamo,
            "Directly": self._direct_load,
            "Compiling": self._compiling,
            "Using": self._cache_dir,
            "init": self._init_engine,
            "Initial": self._profile_warmup,
            "Memory": self._memory_profiling,
            "Available": self._available,
            "GPU": self._kv_size,
            "Maximum": self._max_concurrency,
            "#": self._blocks,
            "Graph": self._graph,
            "It": self._it_took,
            "Sleep": self._sleep_freed,
            "Engine": self._stats,
            "Avg": self._stats,
            "Prefix": self._v0_prefix_hit,
            "Starting": self._api_ready,
            "Application": self._api_ready,
            "non-default": self._non_default_args,
            "Initializing": self._engine_config,
            "vLLM": self._server_version,
            "Cudagraph": self._eager_msg,
            "Enforce": self._eager_msg,
            "Kernel": self._jit_monitor,
            "Shutting": self._shutdown,
            "[shutdown]": self._shutdown,
        }

    # -- helpers ---------------------------------------------------------------------------

    def _max(self, key: str, value: float) -> None:
        old = self.values.get(key)
        if old is None or value > old:
            self.values[key] = value

    def _min(self, key: str, value: float) -> None:
        old = self.values.get(key)
        if old is None or value < old:
            self.values[key] = value

    def _add_per_proc(self, key: str, proc: str | None, value: float) -> None:
        pid_m = _PID.search(proc) if proc else None
        owner = pid_m.group(1) if pid_m is not None else (proc or "")
        sums = self.per_proc[key]
        if owner not in sums and len(sums) >= MAX_PROCESSES:
            self.truncated["processes"] += 1
            owner = "..."  # the processes beyond the cap share one sum
        sums[owner] = sums.get(owner, 0.0) + value

    def _phase(self, name: str, ts: str | None) -> None:
        if ts is not None:
            self.phase_ts[name] = ts

    # -- line entry point -------------------------------------------------------------------

    def feed(self, line: str) -> None:
        m = _match_prefix(line)  # _vllm_prefix inline: a call less on every line
        if m is None:
            start = vllm_line_start(line)
            if start > 0:
                m = _match_prefix(line, start)
        proc: str | None = None
        if m is not None:
            self.evidence += 1
            ts, proc = m.group("ts", "proc")
            if len(ts) == 14:
                ts += ".000"
            elif len(ts) != 18 or ts[14] != ".":  # else already "MM-DD HH:MM:SS.mmm"
                ts = _norm_ts(ts)
            msg = line[m.end() :]
            if msg.startswith(_REQUEST_LOG):
                return
        else:
            ts = None
            k = _KNOWN_MSG.search(line)
            msg = line[k.start() :] if k is not None else ""
            if msg and any(marker in line for marker in _REQUEST_LOG):
                return
        if msg:
            sp = msg.find(" ")
            word = msg[:sp] if sp > 0 else msg
            handler = self.dispatch.get(word)
            if handler is None and word.isdigit():
                handler = self._stats
            if handler is not None and handler(msg, ts, proc):
                if m is None and word not in _GENERIC_WORDS:
                    self.evidence += 1
                return
        if "[shutdown]" in line:
            self._shutdown(line, ts, proc)
            return
        for literal, label, search in _ERRORS:
            if literal in line and search(line) is not None:
                (self.errors_after_shutdown if self.shutdown else self.errors).add(label)
                if label == "oom_killer":  # the kernel's line: a node's kernel log is read for it alone
                    self.evidence += 1

    # -- handlers: each returns True when it recognised the message ---------------------------

    def _loading(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_WEIGHTS.match(msg)
        if m is not None:
            self._max("weights_load_s", float(m.group(1)))
            self._phase("weights_load", ts)
            self.startup_seen = True
            return True
        m = _RE_OLD_WEIGHTS.match(msg)
        if m is not None:
            self._max("model_load_gib", float(m.group(1)))
            self._phase("model_load", ts)
            self.startup_seen = True
            return True
        return False

    def _model_loading(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_MODEL_LOAD.match(msg)
        if m is None:
            return False
        self._max("model_load_gib", float(m.group(1)))
        self._max("model_load_s", float(m.group(2)))
        self._phase("model_load", ts)
        self.startup_seen = True
        return True

    def _compile_total(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_COMPILE_TOTAL.match(msg)
        if m is None:
            return False
        self._max("compile_s", float(m.group(1)))
        self._phase("compile", ts)
        self.startup_seen = True
        return True

    def _compile_off(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        if _RE_COMPILE_OFF.match(msg) is None:
            return False
        self.last["compile_cache_disabled"] = True
        self.startup_seen = True
        return True

    def _dynamo(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_DYNAMO.match(msg)
        if m is None:
            return False
        self._max("dynamo_transform_s", float(m.group(1)))
        self._phase("dynamo_transform", ts)
        self.startup_seen = True
        return True

    def _direct_load(self, msg: str, ts: str | None, proc: str | None) -> bool:
        if _RE_DIRECT.match(msg) is None:
            return False
        self.compile_hit = True
        took = _RE_TOOK_S.search(msg)
        if took is not None:
            self._add_per_proc("compile_cache_load_s", proc, float(took.group(1)))
        self._phase("compile_cache_load", ts)
        self.startup_seen = True
        return True

    def _compiling(self, msg: str, ts: str | None, proc: str | None) -> bool:
        m = _RE_COMPILING.match(msg)
        if m is None:
            return False
        self.compile_miss = True
        self._add_per_proc("inductor_compile_s", proc, float(m.group(1)))
        self._phase("inductor_compile", ts)
        self.startup_seen = True
        return True

    def _cache_dir(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_CACHE_DIR.match(msg)
        if m is None:
            return False
        self.first.setdefault("compile_cache_dir", m.group(1))
        self._phase("compile_cache_dir", ts)
        self.startup_seen = True
        return True

    def _init_engine(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_INIT_ENGINE.match(msg)
        if m is None:
            return False
        self._max("init_engine_s", float(m.group(1)))
        if m.group(2) is not None:
            self._max("init_engine_compilation_s", float(m.group(2)))
        self._phase("init_engine", ts)
        self.startup_seen = True
        return True

    def _profile_warmup(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_PROFILE_WARMUP.match(msg)
        if m is None:
            return False
        self._max("profile_warmup_s", float(m.group(1)))
        self._phase("profile_warmup", ts)
        return True

    def _memory_profiling(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_MEM_PROFILING.match(msg)
        if m is None:
            return False
        self._max("memory_profiling_s", float(m.group(1) or m.group(2)))
        self._phase("memory_profiling", ts)
        return True

    def _available(self, msg: str, ts: str | None, proc: str | None) -> bool:
        m = _RE_AVAIL_KV.match(msg)
        if m is not None:
            self._min("available_kv_cache_gib", float(m.group(1)))
            self._phase("available_kv_cache", ts)
            self.startup_seen = True
            return True
        return self._api_ready(msg, ts, proc)

    def _kv_size(self, msg: str, ts: str | None, proc: str | None) -> bool:
        m = _RE_KV_SIZE.match(msg)
        if m is None:
            return False
        self._min("kv_cache_tokens", _num(m.group(1)))
        self._phase("kv_cache_size", ts)
        self.startup_seen = True
        self._max_concurrency(msg, ts, proc, anchored=False)
        return True

    def _max_concurrency(self, msg: str, ts: str | None, _proc: str | None, *, anchored: bool = True) -> bool:
        m = _RE_MAX_CONC.match(msg) if anchored else _RE_MAX_CONC.search(msg)
        if m is None:
            return False
        self._min("max_concurrency", float(m.group(2)))
        self.last["max_concurrency_req_tokens"] = int(_num(m.group(1)))
        self._phase("kv_cache_size", ts)
        self.startup_seen = True
        return True

    def _blocks(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_BLOCKS.match(msg)
        if m is None:
            return False
        self._min("gpu_blocks", float(m.group(1)))
        self._min("cpu_blocks", float(m.group(2)))
        self._phase("kv_cache_size", ts)
        self.startup_seen = True
        return True

    def _graph(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_GRAPH.match(msg)
        if m is None:
            return False
        self._max("graph_capture_s", float(m.group(1)))
        if m.group(2) is not None:
            self._max("graph_capture_gib", float(m.group(2)))
        self._phase("graph_capture", ts)
        self.startup_seen = True
        return True

    def _it_took(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_SLEEP.match(msg)
        if m is not None:
            value = float(m.group(1))
            self.last["sleep_s"] = value
            event: dict[str, Any] = {"event": "sleep", "s": value}
            if ts is not None:
                event["ts"] = ts
            self._sleep_event(event)
            self._phase("sleep", ts)
            return True
        m = _RE_WAKE.match(msg)
        if m is None:
            return False
        value = float(m.group(1))
        self.last["wake_s"] = value
        event = {"event": "wake", "s": value}
        tags = sorted(a or b for a, b in _RE_QUOTED.findall(m.group(2) or ""))
        if tags:
            event["tags"] = tags
            self.last["wake_tags"] = tags
        else:
            self.last.pop("wake_tags", None)
        if ts is not None:
            event["ts"] = ts
        self._sleep_event(event)
        self._phase("wake", ts)
        return True

    def _sleep_event(self, event: dict[str, Any]) -> None:
        self.sleep_events.append(event)
        self.sleep_seen += 1

    def _sleep_freed(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_SLEEP_FREED.match(msg)
        if m is None:
            return False
        self.last["sleep_freed_gib"] = float(m.group(1))
        self.last["sleep_still_in_use_gib"] = float(m.group(2))
        return True

    def _stats(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        entry = _stats_v1(msg, ts)
        if entry is None:
            entry = _stats_fields(msg, ts)
            if entry is None:
                return False
        self._add_stats(entry)
        return True

    def _add_stats(self, entry: dict[str, Any]) -> None:
        self.stats.append(entry)
        self.stats_seen += 1
        self._note_hits(entry)

    def _note_hits(self, entry: dict[str, Any]) -> None:
        """Keep the hit rates of the newest stats line that has them (entries may be dropped)."""
        for out_key, fields in _LAST_HIT_FIELDS:
            for field in fields:
                if field in entry:
                    self.last_hit[out_key] = entry[field]
                    break

    def _v0_prefix_hit(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_V0_PREFIX_HIT.match(msg)
        if m is None:
            return False
        last = self.stats[-1] if self.stats else None
        if last is None or "gpu_prefix_hit_pct_v0" in last:
            last = {"ts": ts} if ts is not None else {}
            self._add_stats(last)
        last["gpu_prefix_hit_pct_v0"] = float(m.group(1))
        last["cpu_prefix_hit_pct_v0"] = float(m.group(2))
        self._note_hits(last)
        return True

    def _api_ready(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        if _RE_API_READY.match(msg) is None:
            return False
        self.api_ready = True
        self._phase("api_server_ready", ts)
        return True

    def _non_default_args(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        if not msg.startswith("non-default args"):
            return False
        m = _RE_ARGS_EAGER.search(msg)
        if m is not None:
            self._set_eager(m.group(1) == "True")
        self._phase("non_default_args", ts)
        self.startup_seen = True
        return True

    def _engine_config(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_ENGINE_CONFIG.match(msg)
        if m is None:
            return False
        self.first.setdefault("vllm_version", m.group(1))
        self.v0_engine = " V1 " not in msg[:30]
        for regex, key in ((_RE_CFG_MODEL, "model"), (_RE_CFG_TP, "tensor_parallel_size")):
            found = regex.search(msg)
            if found is not None:
                self.first.setdefault(key, int(found.group(1)) if key != "model" else found.group(1))
        eager = _RE_CFG_EAGER.search(msg)
        if eager is not None:
            self._set_eager(eager.group(1) == "True")
        self._phase("engine_init_start", ts)
        self.startup_seen = True
        return True

    def _server_version(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        m = _RE_SERVER_VERSION.match(msg)
        if m is None:
            return False
        self.first.setdefault("vllm_version", m.group(1))
        self.startup_seen = True
        return True

    def _set_eager(self, value: bool) -> None:
        # Any positive evidence wins over a default False seen elsewhere.
        self.eager = value or bool(self.eager)

    def _eager_msg(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        if _RE_EAGER_MSG.match(msg) is None:
            return False
        self._set_eager(True)
        return True

    def _jit_monitor(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        if not msg.startswith("Kernel JIT monitor"):
            return False
        self._phase("jit_monitor", ts)
        return True

    def _shutdown(self, msg: str, ts: str | None, _proc: str | None) -> bool:
        if not (msg.startswith(("[shutdown]", "Shutting down")) or "[shutdown]" in msg):
            return False
        if not self.shutdown:
            self.shutdown = True
            if ts is not None:
                self.phase_ts["shutdown"] = ts
        return True

    # -- result -----------------------------------------------------------------------------

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in ("vllm_version", "model", "tensor_parallel_size"):
            if key in self.first:
                out[key] = self.first[key]
        if self.eager is not None:
            out["enforce_eager"] = self.eager
        v = self.values
        for key in ("weights_load_s", "model_load_s", "model_load_gib"):
            if key in v:
                out[key] = v[key]
        if "compile_cache_dir" in self.first:
            out["compile_cache_dir"] = self.first["compile_cache_dir"]
        if "compile_cache_disabled" in self.last:
            out["compile_cache_disabled"] = True
        if "dynamo_transform_s" in v:
            out["dynamo_transform_s"] = v["dynamo_transform_s"]
        if self.compile_hit or self.compile_miss:
            out["compile_cache_hit"] = self.compile_hit
        for key, sums in self.per_proc.items():
            if sums:
                out[key] = round(max(sums.values()), 6)
        for key in ("compile_s", "profile_warmup_s", "memory_profiling_s", "available_kv_cache_gib"):
            if key in v:
                out[key] = v[key]
        for key in ("kv_cache_tokens", "gpu_blocks", "cpu_blocks"):
            if key in v:
                out[key] = int(v[key])
        if "max_concurrency" in v:
            out["max_concurrency"] = v["max_concurrency"]
            out["max_concurrency_req_tokens"] = self.last["max_concurrency_req_tokens"]
        for key in ("graph_capture_s", "graph_capture_gib", "init_engine_s", "init_engine_compilation_s"):
            if key in v:
                out[key] = v[key]
        if self.api_ready:
            out["api_server_ready"] = True
        for key in ("sleep_s", "wake_s", "wake_tags", "sleep_freed_gib", "sleep_still_in_use_gib"):
            if key in self.last:
                out[key] = self.last[key]
        if self.sleep_events:
            out["sleep_events"] = list(self.sleep_events)
        out["stats"] = list(self.stats)
        out["stats_count"] = self.stats_seen
        for out_key, _fields in _LAST_HIT_FIELDS:
            if out_key in self.last_hit:
                out[out_key] = self.last_hit[out_key]
        if self.shutdown:
            out["shutdown_seen"] = True
        if self.phase_ts:
            out["phase_ts"] = self.phase_ts
        out["errors"] = sorted(self.errors)
        if self.errors_after_shutdown:
            out["errors_after_shutdown"] = sorted(self.errors_after_shutdown)
        out["missing"] = self._missing(out)
        self.truncated["stats"] = self.stats_seen - len(self.stats)
        self.truncated["sleep_events"] = self.sleep_seen - len(self.sleep_events)
        truncated = {key: n for key, n in self.truncated.items() if n}
        if truncated:
            out["truncated"] = truncated
        return out

    def _missing(self, out: dict[str, Any]) -> list[str]:
        if not self.startup_seen:
            return []
        missing: list[str] = []
        for key in EXPECTED_STARTUP:
            if key == "compile":
                present = "compile_s" in out or bool(self.eager) or self.v0_engine
            elif key == "graph_capture_s":
                present = key in out or bool(self.eager)
            elif key == "kv_cache_tokens":
                present = key in out or "gpu_blocks" in out
            else:
                present = key in out
            if not present:
                missing.append(key)
        return missing


# ----------------------------------------------------------------------------------------------
# Reading: bounded chunks of whole lines


class _LineChunks:
    """Chunks of whole lines (about :data:`_CHUNK` bytes each) read from a binary stream.

    A line with no newline within :data:`LINE_MAX` bytes is cut there (the rest is skipped up
    to its newline, ``long_lines`` counts it). ``limit`` caps the bytes read (a gzip stream's
    decompressed size) and ``ratio`` their ratio to ``packed()``, the compressed bytes read so far;
    ``seen_text`` tells whether any non-whitespace byte was read.
    """

    def __init__(
        self,
        stream: IO[bytes],
        source: str,
        *,
        limit: int | None = None,
        ratio: int | None = None,
        packed: Callable[[], int] | None = None,
        gzipped: bool = False,
        binary_check: bool = False,
    ) -> None:
        self.stream = stream
        self.source = source
        self.limit = limit
        self.ratio = ratio
        self.packed = packed
        self.gzipped = gzipped
        self.binary_check = binary_check
        self.total = 0
        self.long_lines = 0
        self.seen_text = False

    def _read(self) -> bytes:
        try:
            data = self.stream.read(_CHUNK)
        except (OSError, EOFError, zlib.error) as exc:
            if self.gzipped:
                raise LogInputError(self.source, f"corrupt gzip file: {exc}") from exc
            raise LogInputError(self.source, f"cannot read file: {exc.strerror or exc}") from exc
        self.total += len(data)
        if self.limit is not None and self.total > self.limit:
            raise LogInputError(
                self.source,
                f"gzip data inflates past {_size(self.limit)}, the limit for a compressed log "
                f"(set {GUNZIP_LIMIT_ENV} to raise it)",
            )
        if self.ratio is not None and self.packed is not None and self.total > GUNZIP_RATIO_FLOOR:
            packed = max(1, self.packed())
            if self.total > self.ratio * packed:
                raise LogInputError(
                    self.source,
                    f"gzip data inflates more than {self.ratio} times ({_size(self.total)} from "
                    f"{_size(packed)}; a text log deflates less than 100 times): a gzip bomb? "
                    f"(set {GUNZIP_RATIO_ENV} to raise the limit)",
                )
        if not self.seen_text and data.strip():
            if self.binary_check and self.total == len(data) and b"\x00" in data[:_SNIFF]:
                raise LogInputError(self.source, "binary file: no vLLM log lines found")
            self.seen_text = True
        return data

    def __iter__(self) -> Iterator[bytes]:
        carry = b""
        skipping = False
        while True:
            data = self._read()
            if not data:
                break
            if skipping:  # the rest of a cut line
                nl = data.find(b"\n")
                if nl < 0:
                    continue
                data = data[nl + 1 :]
                skipping = False
            buf = carry + data if carry else data
            cut = buf.rfind(b"\n")
            if cut >= 0:
                carry = buf[cut + 1 :]
                yield buf[: cut + 1]
            elif len(buf) > LINE_MAX:
                if self.binary_check and b"\x00" in buf:
                    raise LogInputError(self.source, f"binary data after byte {self.total - len(buf)}: not a text log")
                self.long_lines += 1
                carry = b""
                skipping = True
                yield buf[:LINE_MAX] + b"\n"
            else:
                carry = buf
        if carry:
            yield carry


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} bytes"


# ----------------------------------------------------------------------------------------------
# Keyword lines, line timestamps


KeywordFinder = Callable[[bytes], Iterator[re.Match[bytes]]]


def _keyword_lines(chunk: bytes, find: KeywordFinder = _KW_FIND) -> list[tuple[int, int]]:
    """``(start, end)`` offsets, in order, of the lines of ``chunk`` (split on ``\\n``) that hold a keyword."""
    rfind = chunk.rfind
    return [(rfind(b"\n", 0, m.start()) + 1, m.end()) for m in find(chunk.translate(_PIVOT_TABLE))]


def _has_keyword(text: str) -> bool:
    return _KW_REGEX.search(text.encode("utf-8", "replace").translate(_PIVOT_TABLE)) is not None


def _clean(chunk: str) -> str:
    return _ANSI.sub("", chunk) if "\x1b" in chunk else chunk


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


# Where a line may carry vLLM's prefix: its "MM-DD HH:MM:SS" (a pattern that starts with a literal
# byte, the fast scan in ``re``; ANSI codes are assumed not to split a timestamp).
_TS_SHAPE = re.compile(rb":\d\d:\d\d(?<=\d\d-\d\d \d\d:\d\d:\d\d)")
_WALK = 16  # lines looked at one by one at each end of a chunk before the timestamp scan
_BACK_WINDOW = 16 * 1024  # bytes scanned at a time for the last timestamp, back from a chunk's end


def _forward_lines(chunk: bytes) -> Iterator[tuple[int, int]]:
    """Line spans of ``chunk`` from the start: the first :data:`_WALK`, then those with a timestamp."""
    size = len(chunk)
    start = 0
    for _ in range(_WALK):
        if start >= size:
            return
        end = chunk.find(b"\n", start)
        end = size if end < 0 else end
        yield start, end
        start = end + 1
    pos = start
    while pos < size and (m := _TS_SHAPE.search(chunk, pos)) is not None:
        end = chunk.find(b"\n", m.end())
        end = size if end < 0 else end
        yield chunk.rfind(b"\n", 0, m.start()) + 1, end
        pos = end + 1


def _backward_lines(chunk: bytes) -> Iterator[tuple[int, int]]:
    """Line spans of ``chunk`` from the end: the last :data:`_WALK`, then those with a timestamp."""
    end = len(chunk) - 1 if chunk.endswith(b"\n") else len(chunk)
    for _ in range(_WALK):
        if end < 0:
            return
        start = chunk.rfind(b"\n", 0, end) + 1
        yield start, end
        end = start - 1
    # Then back a window at a time (a chunk whose every line has the shape, as behind a line shipper's
    # own stamp, is not scanned whole when its last prefixed line is near its end).
    while end > 0:
        low = chunk.rfind(b"\n", 0, max(0, end - _BACK_WINDOW)) + 1  # a line's start
        starts = sorted({chunk.rfind(b"\n", 0, m.start()) + 1 for m in _TS_SHAPE.finditer(chunk, low, end)})
        for start in reversed(starts):
            yield start, chunk.find(b"\n", start)  # found: chunk[end] is the newline before the lines walked
        end = low - 1


class _Edges:
    """First and last timestamps of the lines that carry vLLM's prefix (after unwrapping)."""

    def __init__(self) -> None:
        self.first: str | None = None
        self.last: str | None = None

    @staticmethod
    def _ts(raw: bytes, strip: Strip | None) -> str | None:
        text = _decode(raw[:LINE_MAX])
        if strip is not None:
            inner = strip(text)
            if inner is not None:
                text = inner
        text = _clean(text)
        m = _vllm_prefix(text)
        return m.group("ts") if m is not None else None

    def _find(self, chunk: bytes, spans: Iterator[tuple[int, int]], strip: Strip | None) -> str | None:
        for start, end in spans:
            ts = self._ts(chunk[start:end], strip)
            if ts is not None:
                return ts
        return None

    def scan(self, chunk: bytes, strip: Strip | None) -> None:
        """Look at ``chunk`` (whole lines): the first prefixed line until one is found, then the last."""
        if self.first is None:
            self.first = self._find(chunk, _forward_lines(chunk), strip)
            if self.first is None:
                return
        last = self._find(chunk, _backward_lines(chunk), strip)
        if last is not None:
            self.last = last


_ENGINE_CORE = b"(EngineCore"
# The marker in a line's process prefix (nested ones too), not in a message.
_ENGINE_CORE_HEAD = re.compile(r"[ \t]*(?:\([^()]*\)[ \t]*)*\(EngineCore")


class _EngineCoreStart:
    """Where the EngineCore process begins: the timestamp of its first line that has one, and of
    the last prefixed line before its first output (there the API server's config resolution
    ends). One ``bytes.find`` per chunk until both are known; nothing after."""

    def __init__(self) -> None:
        self.first: str | None = None
        self.before: str | None = None
        self.seen = False  # the EngineCore's first output line was found

    def scan(self, chunk: bytes, strip: Strip | None, edges: _Edges) -> None:
        """Look at ``chunk`` before ``edges`` scans it (``edges.last`` is then the previous chunks')."""
        pos = 0
        while self.first is None:
            hit = chunk.find(_ENGINE_CORE, pos)
            if hit < 0:
                return
            start = chunk.rfind(b"\n", 0, hit) + 1
            end = chunk.find(b"\n", hit)
            end = len(chunk) if end < 0 else end
            pos = end + 1
            text = _decode(chunk[start:min(end, start + LINE_MAX)])
            if strip is not None:
                inner = strip(text)
                if inner is not None:
                    text = inner
            text = _clean(text)
            if _ENGINE_CORE_HEAD.match(text) is None:
                head = vllm_line_start(text)  # after a collector's prefix that was not stripped
                if head <= 0 or _ENGINE_CORE_HEAD.match(text, head) is None:
                    continue
            if not self.seen:
                self.seen = True
                head = chunk[:start]
                self.before = edges._find(head, _backward_lines(head), strip) if head else None
                self.before = self.before or edges.last
            m = _vllm_prefix(text)
            if m is not None:
                self.first = m.group("ts")


# ----------------------------------------------------------------------------------------------
# Parsing a stream


def _parse_stream(lines: _LineChunks, source: str, *, check_empty: bool) -> dict[str, Any]:
    collector = _Collector()
    feed = collector.feed
    edges = _Edges()
    engine_core = _EngineCoreStart()
    wrapper: Wrapper | None = None
    strip: Strip | None = None
    pending: dict[bytes, bytes] = {}  # CRI partial records per stream
    cut_lines = 0
    for whole_lines in lines:
        chunk = whole_lines
        if wrapper is None:
            sample = chunk[: _DETECT_LINES * 1024].split(b"\n", _DETECT_LINES)[:_DETECT_LINES]
            wrapper = detect([_decode(line[:LINE_MAX]) for line in sample])
            strip = None if wrapper is NONE else wrapper.strip
        if wrapper.name == "kubernetes-cri" and (pending or b" stdout P " in chunk or b" stderr P " in chunk):
            chunk = rejoin_cri(chunk, pending, LINE_MAX)
        if engine_core.first is None:
            engine_core.scan(chunk, strip, edges)
        edges.scan(chunk, strip)
        # After the first shutdown line, later ones cannot change the record: their keywords go.
        for start, end in _keyword_lines(chunk, _KW_FIND_AFTER_SHUTDOWN if collector.shutdown else _KW_FIND):
            stop = end
            if end - start > LINE_MAX:
                cut_lines += 1
                stop = start + LINE_MAX
            text = chunk[start:stop].decode("utf-8", "replace")
            if strip is not None:
                inner = strip(text)
                if inner is not None:
                    text = inner
                    if "\n" in text:  # a JSON payload may hold several lines
                        text = text.replace("\n", "\r")
            if "\r" in text:
                for part in text.split("\r"):
                    if part and _has_keyword(part):
                        feed(_clean(part))
            elif "\x1b" in text:
                feed(_ANSI.sub("", text))
            else:
                feed(text)
    for rest in pending.values():  # partial records never ended by a full one
        for part in _LINE_SPLIT.split(_decode(rest)):
            if part and _has_keyword(part):
                feed(_clean(part))
    if check_empty and not lines.seen_text:
        raise LogInputError(source, "empty file: no vLLM log lines found")
    wrapper = wrapper or NONE
    if edges.first is None and collector.evidence == 0:
        found = "" if wrapper is NONE else f" (read as a {wrapper.name} log)"
        raise ParseError(source, f"no vLLM log lines found{found}")
    out: dict[str, Any] = {"wrapper": wrapper.name}
    if edges.first is not None:
        last = edges.last or edges.first
        out["first_ts"], out["last_ts"], out["ts_has_ms"] = _norm_ts(edges.first), _norm_ts(last), len(edges.first) > 14
    collector.truncated["long_lines"] += lines.long_lines + cut_lines
    for name, ts in (("api_config", engine_core.before), ("engine_core_start", engine_core.first)):
        if ts is not None:
            collector.phase_ts[name] = _norm_ts(ts)
    out.update(collector.result())
    log.debug("%s: %d stats lines, errors=%s", source, out["stats_count"], out["errors"])
    return out


def parse_log_text(text: str, *, source: str = "<text>") -> dict[str, Any]:
    """Parse the text of a vLLM server log (see the module docstring for the output).

    Raises :class:`ParseError` (naming ``source``) when no vLLM log line is found.
    """
    stream = io.BytesIO(text.encode("utf-8", errors="surrogatepass"))
    return _parse_stream(_LineChunks(stream, source), source, check_empty=False)


def _env_limit(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return max(1, int(raw))
    except ValueError:
        log.warning("ignoring %s=%r: not a whole number", name, raw)
        return default


def _open_regular(path: Path) -> IO[bytes]:
    """Open ``path`` for reading if it is a regular file (never waits on a FIFO, a device or a
    kernel file such as /proc/kmsg)."""
    try:
        return open_regular(path)
    except NotRegularFile as exc:
        raise LogInputError(str(path), f"cannot read file: {exc.kind}, not a regular file") from exc
    except OSError as exc:
        raise LogInputError(str(path), f"cannot read file: {exc.strerror or exc}") from exc


def parse_log_file(path: Path) -> dict[str, Any]:
    """Read and parse a vLLM log file (plain or gzip-compressed), streaming it line by line.

    Raises :class:`LogInputError` (a :class:`ParseError`) when the file is not a regular file,
    unreadable, empty, binary or a gzip stream that inflates past the limits, and
    :class:`ParseError` when it is not a vLLM log.
    """
    path = Path(path)
    source = str(path)
    with _open_regular(path) as raw:
        try:
            head = raw.read(2)
            raw.seek(0)
        except OSError as exc:
            raise LogInputError(source, f"cannot read file: {exc.strerror or exc}") from exc
        if head == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                lines = _LineChunks(unzipped, source, limit=_env_limit(GUNZIP_LIMIT_ENV, MAX_GUNZIP_BYTES),
                                    ratio=_env_limit(GUNZIP_RATIO_ENV, MAX_GUNZIP_RATIO), packed=raw.tell,
                                    gzipped=True, binary_check=True)  # fmt: skip
                return _parse_stream(lines, source, check_empty=True)
        return _parse_stream(_LineChunks(raw, source, binary_check=True), source, check_empty=True)


def parse_log_if_any(path: Path) -> dict[str, Any]:
    """:func:`parse_log_file`, or ``{}`` when there is no such file or it is not a vLLM log (a trial
    whose engine never started still has a row: its metrics are just absent)."""
    if not Path(path).is_file():
        return {}
    try:
        return parse_log_file(path)
    except ParseError:
        return {}
