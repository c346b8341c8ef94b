"""KV blocks behind a sliding window go back to the pool while a long generation runs.

Mistral with sliding_window 8 on every layer and block size 4: after n computed tokens the next
query reads keys n-7..n, so a sequence holds at most window / block_size + 2 blocks (the window's
blocks, a partly filled one, and one being written) however long it grows. The tokens must stay
those of transformers' greedy generate(), and those of the same engine with release turned off.
"""

from __future__ import annotations

import pytest
import torch

from lantern.app.engine import LLM, SamplingParams
from lantern.app.engine.sequence import Sequence

WINDOW, BLOCK = 8, 4
PER_SEQ = WINDOW // BLOCK + 2
PROMPTS = [
    "Paged attention stores keys and values in blocks, while continuous batching",
    "The quick brown fox",
]


def hf_greedy(path: str, prompts: list[list[int]], n: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # never stop early: compare all n tokens
    outs = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
            outs.append(out[0, len(ids) :].tolist())
    return outs


def make_llm(path: str, backend: str, release: bool = True) -> LLM:
    llm = LLM(path, backend=backend, dtype="float32", block_size=BLOCK, prefill_chunk_size=8, num_kv_blocks=64)
    if not release:
        llm.engine.block_manager.release_window = None  # keep every block: the reference run
    return llm


def generate_tracking_blocks(llm: LLM, prompts: list[list[int]], params: SamplingParams):
    """Run the prompts together step by step; returns (tokens per prompt, peak used blocks)."""
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(f"w{i}", p, params)
    results: dict[int, list[int]] = {}
    peak = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                results[int(out.request_id[1:])] = out.outputs[0].token_ids
        # Sampled after the step: blocks held between steps, and the pool's reported usage agrees.
        used = engine.block_manager.num_used_blocks
        assert engine.stats_snapshot()["kv_usage"] == used / engine.block_manager.num_blocks
        peak = max(peak, used)
    return [results[i] for i in range(len(prompts))], peak


@pytest.fixture(scope="module")
def path(tiny_model_dir):
    return tiny_model_dir("mistral_swa")


def test_model_releases_blocks(path, backend):
    llm = make_llm(path, backend)
    assert llm.engine.model_config.all_layers_slide
    assert llm.engine.block_manager.release_window == WINDOW


def test_long_generation_keeps_blocks_bounded_and_tokens_exact(path, backend):
    llm = make_llm(path, backend)
    prompts = [llm.tokenizer.encode(p) for p in PROMPTS]
    assert len(prompts[0]) > WINDOW  # the prompt itself outgrows the window
    n = 200
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    ours, peak = generate_tracking_blocks(llm, prompts, params)
    # 64 blocks hold 256 tokens: without release the two sequences (> 200 tokens each) would not fit.
    assert peak <= len(prompts) * PER_SEQ
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and all(r == 0 for r in bm.ref_counts)
    assert ours == hf_greedy(path, prompts, n)
    assert all(len(set(t)) > 8 for t in ours), "degenerate reference"


def test_release_changes_no_token(path, backend):
    prompts = [tokenizer(path).encode(p) for p in PROMPTS]
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    kept, peak_kept = generate_tracking_blocks(make_llm(path, backend, release=False), prompts, params)
    freed, peak_freed = generate_tracking_blocks(make_llm(path, backend), prompts, params)
    assert freed == kept
    assert peak_freed <= len(prompts) * PER_SEQ < peak_kept


def test_prefix_hit_revives_released_blocks(path, backend):
    # A second turn: the first request's prompt and reply plus a new question. Its blocks behind the
    # window were released while it ran; the second request's hit revives the ones the window
    # at its end reads, never recomputes the rest, and its tokens equal an uncached run's.
    llm = make_llm(path, backend)
    bm = llm.engine.block_manager
    first = llm.tokenizer.encode(PROMPTS[0])
    reply = llm.generate([first], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    turn2 = first + reply.outputs[0].token_ids + llm.tokenizer.encode(PROMPTS[1])
    revivable = {b for b, h in enumerate(bm.block_hash) if h is not None}
    assert len(revivable) >= (len(first) + 40) // BLOCK - 1  # released and finished blocks stay cached
    hit = bm.find_cached_prefix(Sequence("probe", turn2, SamplingParams()))  # what admission will find
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    out = llm.generate([turn2], params)[0]
    assert out.num_cached_tokens == len(hit) * BLOCK >= len(first) + 32
    assert -1 in hit and all(b in revivable for b in hit if b >= 0)
    ref = make_llm(path, backend)
    ref.engine.block_manager.enable_prefix_caching = False
    assert out.outputs[0].token_ids == ref.generate([turn2], params)[0].outputs[0].token_ids


def tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
