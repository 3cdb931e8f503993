"""The offload kind's modes: each an engine configuration rendered from data, and its parameters.

``recipe`` in a trial's params holds the exact vLLM flags and environment of its mode (plan.json
shows them); what depends on the node, the engine or the trial (the file-system tier's folder,
each copy's port and GPUs, the preflight's need) is planned in :mod:`.setup`. The workload's and
the quality check's defaults are the node's own (``nodetools.loadgen.workload``): one source.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, computed_field

from nodetools.loadgen.workload import MAX_FAILED_REQUESTS, QualitySpec, Workload
from runner.experiments.base import MAX_SECONDS, ModeParams, NumbersAreNotBooleans

__all__ = ["MODES", "RECIPES", "TRIAL_FS_DIR", "OffloadParams", "QualityParams", "WorkloadParams"]

TRIAL_FS_DIR = "{trial_fs_dir}"  # replaced at plan time with this trial's own folder of the fs tier

# The mode table. ``args`` are vllm serve flags (values may be computed from the mode's
# parameters, see ``_offload``), ``env`` its environment. ``min_version``: the vLLM release that
# first accepts the configuration (older engines skip the mode with that reason). ``shm``: vLLM's
# native backend maps its buffer under /dev/shm. ``standin``: why the stand-in cannot rehearse it.
# ``python_module``: a package the engine's Python (or image) must have beside vLLM.
RECIPES: dict[str, dict[str, Any]] = {
    "hbm_only": {"summary": "no offload: the GPU prefix cache only"},
    "native_cpu": {"summary": "--kv-offloading-backend native --kv-offloading-size <GiB>",
                   # cpu_bytes_to_use behind --kv-offloading-size: vLLM PR #24498 (Sep 2025). Verify
                   # against the pinned engine.
                   "min_version": "0.11.0", "shm": True},
    "lmcache_cpu": {"summary": "LMCacheConnectorV1, LMCACHE_LOCAL_CPU with LMCACHE_MAX_LOCAL_CPU_SIZE GB",
                    "python_module": "lmcache"},
    "lmcache_disk": {"summary": "LMCacheConnectorV1 with a CPU buffer and LMCACHE_LOCAL_DISK",
                     "python_module": "lmcache"},
    "tiered": {"summary": "OffloadingConnector + TieringOffloadingSpec: a RAM tier, then a file-system tier",
               # vllm.v1.kv_offload.tiering ships since v0.22.0.
               "min_version": "0.22.0", "shm": True},
}
_COMMON_ARGS = {"enable-prompt-tokens-details": True}  # usage.prompt_tokens_details.cached_tokens, per request
_W, _Q = Workload(), QualitySpec()
# Upper bounds, far past any node's (a typo must not plan 10**18 engine copies or sessions).
_MAX_COUNT = 100_000  # sessions, conversations
_MAX_TURNS = 10_000
_MAX_IN_FLIGHT = 10_000
_MAX_TOKENS = 10_000_000  # a history, a turn, a document: 10M tokens is past every model's context
_MAX_GIB = 2**30  # a tier of 1 EiB: past any node, and finite (1e300 GiB overflowed the sizing)
_MAX_COPIES = 64  # engine copies on one node: each needs a port and its share of the GPUs
_SEED = {"ge": -(2**63), "le": 2**63 - 1}


class _Strict(NumbersAreNotBooleans):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)


class WorkloadParams(_Strict):
    """The load (defaults: the reference campaign's 32 sessions x ~100K tokens, 8 in flight, 6 turns)."""

    sessions: int = Field(default=_W.sessions, ge=1, le=_MAX_COUNT)
    history_tokens: int = Field(default=_W.history_tokens, ge=0, le=_MAX_TOKENS,
                                description="each session's history before turn 0")
    concurrency: int = Field(default=_W.concurrency, ge=1, le=_MAX_IN_FLIGHT, description="requests in flight")
    turns: int = Field(default=_W.turns, ge=1, le=_MAX_TURNS)
    turn_tokens: int = Field(default=_W.turn_tokens, ge=0, le=_MAX_TOKENS, description="new user tokens per turn")
    output_tokens: int = Field(default=_W.output_tokens, ge=1, le=_MAX_TOKENS,
                               description="forced with min_tokens + ignore_eos")
    seed: int = Field(default=_W.seed, **_SEED)
    request_timeout_s: float = Field(default=_W.request_timeout_s, gt=0, le=MAX_SECONDS)
    max_wall_s: float = Field(default=_W.max_wall_s, gt=0, le=MAX_SECONDS,
                              description="cap on the whole load (the reference campaign's LMCache run: 40 min)")
    retries: int = Field(default=_W.retries, ge=0, le=100,
                         description="off by default: a failed request is a recorded failure")
    max_failed_requests: int = Field(default=MAX_FAILED_REQUESTS, ge=0, le=_MAX_COUNT * _MAX_TURNS,
                                     description="more failed or unsent requests fail the trial")

    def workload(self) -> Workload:
        """The node's dataclass with these values (``max_failed_requests`` is the runner's)."""
        return Workload(**self.model_dump(exclude={"max_failed_requests"}))


class QualityParams(_Strict):
    """Multi-turn arithmetic over a shared document (the reference campaign: 24 questions), plus a loop check."""

    enabled: bool = True
    conversations: int = Field(default=_Q.conversations, ge=1, le=_MAX_COUNT)
    turns: int = Field(default=_Q.turns, ge=1, le=_MAX_TURNS)
    doc_tokens: int = Field(default=_Q.doc_tokens, ge=100, le=_MAX_TOKENS)
    max_tokens: int = Field(default=_Q.max_tokens, ge=16, le=_MAX_TOKENS)
    seed: int = Field(default=_Q.seed, **_SEED)
    request_timeout_s: float = Field(default=_Q.request_timeout_s, gt=0, le=MAX_SECONDS)
    concurrency: int = Field(default=_Q.concurrency, ge=1, le=_MAX_IN_FLIGHT, description="conversations in flight")

    def spec(self) -> QualitySpec | None:
        """The node's dataclass, or None when the check is off."""
        return QualitySpec(**self.model_dump(exclude={"enabled"})) if self.enabled else None


class OffloadParams(ModeParams):
    workload: WorkloadParams = WorkloadParams()
    quality: QualityParams = QualityParams()
    engine_copies: int = Field(default=1, ge=1, le=_MAX_COPIES, description="engines started side by side on the node, "
                               "each on an equal share of engine.gpus (the reference campaign's gpt-oss run: 4)")
    cleanup: bool = Field(default=False, description="remove stale /dev/shm/vllm_offload_* files and leftover "
                          "engine containers instead of refusing to run")
    ready_timeout_s: float = Field(default=1800, gt=0, le=MAX_SECONDS,
                                   description="per engine copy, from start to first answer")
    RECIPE: ClassVar[dict[str, Any]] = {}
    MODE: ClassVar[str] = ""

    def _offload(self) -> tuple[dict[str, Any], dict[str, str], float]:
        return {}, {}, 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def recipe(self) -> dict[str, Any]:
        args, env, host_gib = self._offload()
        return {"mode": self.MODE, "summary": self.RECIPE["summary"], "args": {**_COMMON_ARGS, **args}, "env": env,
                "host_gib_per_copy": host_gib, "shm": bool(self.RECIPE.get("shm")),
                "fs": isinstance(self, _FsTier), "min_version": self.RECIPE.get("min_version", ""),
                "standin": self.RECIPE.get("standin", ""), "image": getattr(self, "image", ""),
                "python_module": self.RECIPE.get("python_module", ""),
                "refuse_torch_ops": not getattr(self, "allow_torch_fallback", True)}


class HbmOnlyParams(OffloadParams):
    RECIPE: ClassVar[dict[str, Any]] = RECIPES["hbm_only"]
    MODE: ClassVar[str] = "hbm_only"


class _HostTier(OffloadParams):
    offload_gib: float = Field(default=200, gt=0, le=_MAX_GIB,
                               description="host RAM per engine copy (the reference campaign: 200 GiB)")
    ram_safety_factor: float = Field(
        default=2.0, ge=1.0, le=100, description="host RAM the preflight reserves per requested GiB: vLLM issue 53042 "
        "measured 1.92x the requested size as unreclaimable shared memory")


class _FsTier(_HostTier):
    fs_dir: str = Field(default="", description="folder of the file-system tier on the node (the RAID); the "
                        "trial uses its own subfolder and removes it afterwards; empty: the trial's work folder")
    fs_gib: float = Field(default=100, gt=0, le=_MAX_GIB, description="free space the file-system tier must find there")


class NativeCpuParams(_HostTier):
    RECIPE: ClassVar[dict[str, Any]] = RECIPES["native_cpu"]
    MODE: ClassVar[str] = "native_cpu"

    def _offload(self) -> tuple[dict[str, Any], dict[str, str], float]:
        return {"kv-offloading-backend": "native", "kv-offloading-size": self.offload_gib}, {}, self.offload_gib


def _lmcache_env(cpu_gib: float, chunk_size: int) -> dict[str, str]:
    return {"LMCACHE_CHUNK_SIZE": str(chunk_size), "LMCACHE_LOCAL_CPU": "True",
            "LMCACHE_MAX_LOCAL_CPU_SIZE": f"{cpu_gib:g}"}


_LMCACHE_ARGS = {"kv-transfer-config": {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}}


class _LmcacheImage(_Strict):
    image: str = Field(default="", description="docker image with LMCache inside (the reference campaign: "
                       "lmcache/vllm-openai:v0.5.6rc3); empty: the campaign's engine image")
    chunk_size: int = Field(default=256, ge=16, le=2**20,
                            description="LMCACHE_CHUNK_SIZE: a multiple of the model's block")
    allow_torch_fallback: bool = Field(default=False, description="measure LMCache on its torch-ops fallback (its "
                                       "log's 'compiled extension not found') instead of refusing the run")


class LmcacheCpuParams(_LmcacheImage, _HostTier):
    RECIPE: ClassVar[dict[str, Any]] = RECIPES["lmcache_cpu"]
    MODE: ClassVar[str] = "lmcache_cpu"

    def _offload(self) -> tuple[dict[str, Any], dict[str, str], float]:
        return dict(_LMCACHE_ARGS), _lmcache_env(self.offload_gib, self.chunk_size), self.offload_gib


class LmcacheDiskParams(_LmcacheImage, _FsTier):
    RECIPE: ClassVar[dict[str, Any]] = RECIPES["lmcache_disk"]
    MODE: ClassVar[str] = "lmcache_disk"

    def _offload(self) -> tuple[dict[str, Any], dict[str, str], float]:
        env = {**_lmcache_env(self.offload_gib, self.chunk_size), "LMCACHE_LOCAL_DISK": f"file://{TRIAL_FS_DIR}/",
               "LMCACHE_MAX_LOCAL_DISK_SIZE": f"{self.fs_gib:g}"}
        return dict(_LMCACHE_ARGS), env, self.offload_gib


class TieredParams(_FsTier):
    RECIPE: ClassVar[dict[str, Any]] = RECIPES["tiered"]
    MODE: ClassVar[str] = "tiered"
    eviction_policy: Literal["lru", "arc"] = "lru"

    def _offload(self) -> tuple[dict[str, Any], dict[str, str], float]:
        extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": int(self.offload_gib * 2**30),
                 "eviction_policy": self.eviction_policy,
                 "secondary_tiers": [{"type": "fs", "root_dir": TRIAL_FS_DIR, "n_read_threads": 32,
                                      "n_write_threads": 16}]}
        config = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}
        return {"kv-transfer-config": config}, {}, self.offload_gib


MODES: dict[str, type[OffloadParams]] = {
    "hbm_only": HbmOnlyParams, "native_cpu": NativeCpuParams, "lmcache_cpu": LmcacheCpuParams,
    "lmcache_disk": LmcacheDiskParams, "tiered": TieredParams,
}
