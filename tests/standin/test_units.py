"""In-process checks of the stand-in's pieces: tokenizer, block cache, hit-rate window, flags."""

from __future__ import annotations

import pytest

from nodetools.standin.cli import parse_serve_args
from nodetools.standin.config import Knobs, knobs_markdown_table, resolve_offload
from nodetools.standin.kvcache import HostTier, KvCacheManager, hash_blocks
from nodetools.standin.metrics import CachingMetrics
from nodetools.standin.textgen import AnswerGenerator, RegexTokenizer, render_chat
from tests.standin.support import REPO


def test_regex_fallback_tokenizer_is_stable_and_lossless() -> None:
    tok = RegexTokenizer()
    text = render_chat([{"role": "user", "content": "Naïve  spacing,\ttabs and supercalifragilistic words!"}])
    ids = tok.encode(text)
    assert RegexTokenizer().encode(text) == ids  # another instance (another process) agrees
    assert tok.decode(ids) == text
    assert ids[0] == tok.encode("<|im_start|>")[0]


def test_generated_answers_re_tokenize_to_their_own_ids_with_the_regex_fallback() -> None:
    tok = RegexTokenizer()
    prompt = tok.encode("Tell me a story.")
    gen = AnswerGenerator(tok, prompt, seed=None, base_seed=0)
    pieces = [gen.next_piece() for _ in range(200)]
    assert tok.encode("".join(p for _, p in pieces)) == [i for i, _ in pieces]
    again = AnswerGenerator(tok, prompt, seed=None, base_seed=0)
    assert [again.next_piece() for _ in range(200)] == pieces
    assert [AnswerGenerator(tok, prompt, seed=1, base_seed=0).next_piece() for _ in range(20)] != pieces[:20]


def test_chain_hashes_share_only_prefixes() -> None:
    a = list(range(64))
    b = [*range(16), 99, *range(17, 64)]  # differs in block 1 only
    ha, hb = hash_blocks(a, 16), hash_blocks(b, 16)
    assert ha[0] == hb[0]
    assert all(x != y for x, y in zip(ha[1:], hb[1:], strict=True))  # the change propagates


def _visit(kv: KvCacheManager, seq: list[int]) -> tuple[int, int]:
    """Admit, compute and finish one request the way the engine does; returns (gpu, external) blocks."""
    hashes = hash_blocks(seq, 16)
    look = kv.lookup(hashes, len(seq))
    kv.pool.acquire(look.gpu_hashes)
    need = kv.blocks_for(len(seq)) - look.gpu_blocks
    evicted = kv.pool.allocate(need)
    assert evicted is not None
    kv.on_gpu_evicted(evicted)
    held, private = list(look.gpu_hashes), need
    for i, h in enumerate(hashes[look.gpu_blocks:], start=look.gpu_blocks):
        if kv.pool.commit(h):
            held.append(h)
            private -= 1
        kv.on_computed(h, i < len(seq) // 16)
    kv.pool.release(held, private)
    return look.gpu_blocks, len(look.external)


@pytest.mark.parametrize(("tier_blocks", "policy", "expect_external"), [
    (0, "write-through", 0.0), (2000, "write-through", 0.95), (500, "write-through", 0.0),
    (500, "victim", 0.3)])
def test_lru_pathology_and_tiers(tier_blocks: int, policy: str, expect_external: float) -> None:
    tiers = [HostTier(tier_blocks)] if tier_blocks else []
    kv = KvCacheManager(16, 1000, tiers=tiers, policy=policy)
    sessions = [[s * 10_000 + i for i in range(1600)] for s in range(13)]
    gpu = ext = total = 0
    for turn in range(3):
        for s, seq in enumerate(sessions):
            seq.extend(s * 10_000 + 5000 + turn * 16 + i for i in range(16))
            g, e = _visit(kv, seq)
            if turn:
                gpu, ext, total = gpu + g, ext + e, total + len(seq) // 16
    assert gpu == 0  # 1.3x the pool, visited round-robin: everything is evicted before reuse
    assert ext / total >= expect_external
    if expect_external == 0.0:
        assert ext == 0  # a tier smaller than the pool only mirrors it (write-through)


def test_caching_metrics_window_is_the_last_n_requests() -> None:
    window = CachingMetrics(max_recent_requests=3)
    for queries, hits in ((100, 0), (100, 100), (100, 100), (100, 100)):
        window.observe(queries, hits)
    assert window.hit_rate == 1.0  # the miss fell out of the window
    window.reset()
    assert window.hit_rate == 0.0


def test_kv_transfer_config_tiering_spec_gives_ram_and_fs_tiers() -> None:
    plan = resolve_offload(None, None, {
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 2**30,
                                      "secondary_tiers": [{"type": "fs", "root_dir": "/mnt/kv"}]},
    }, Knobs(), {})
    assert (plan.connector, plan.spec, plan.cpu_bytes, plan.fs_root) == (
        "OffloadingConnector", "TieringOffloadingSpec", 2**30, "/mnt/kv")
    native = resolve_offload(200.0, "native", None, Knobs(), {})
    assert (native.spec, native.cpu_bytes) == ("CPUOffloadingSpec", 200 * 2**30)
    assert not resolve_offload(None, None, None, Knobs(), {}).enabled


def test_serve_args_non_default_dict_knobs_and_secrets() -> None:
    cfg = parse_serve_args(["/m", "--max-model-len", "32k", "--api-key", "s3cret",
                            "--kv-offloading-size", "8", "--standin-decode-s-per-token", "0.02"],
                           {"STANDIN_DECODE_S_PER_TOKEN": "0.5", "STANDIN_SLEEP_S": "2"})
    assert cfg.max_model_len == 32000
    assert cfg.knobs.decode_s_per_token == 0.02  # the flag wins over the environment
    assert cfg.knobs.sleep_s == 2.0
    assert cfg.non_default_args == {"model_tag": "/m", "model": "/m", "api_key": "***",
                                    "max_model_len": 32000, "kv_offloading_size": 8.0}
    assert cfg.offload.connector == "OffloadingConnector"


def test_every_knob_is_documented() -> None:
    table = knobs_markdown_table()
    docs = (REPO / "docs/standin.md").read_text()
    for line in table.splitlines()[2:]:
        flag = line.split("`")[1]
        assert f"`{flag}`" in docs, flag
