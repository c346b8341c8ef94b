"""Continuous batching on real (tiny) models: batch invariance, preemption, prefix cache, n > 1.

Batch invariance, preemption and the prefix cache run over several families: dense Llama, Mistral
with a sliding window of 8 (shorter than most prompts here, so KV blocks behind it are released
while sequences run), Gemma 3 (local and global layers) and Qwen3-MoE."""

from __future__ import annotations

import random

import pytest

from lantern.app.engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
# llama2 runs the full-size cases; the other families run lighter ones (CI has 2 cores).
FAMILIES = ["llama2", "mistral_swa", "gemma3", "qwen3_moe"]


def make_prompts(tokenizer, count, seed=0, min_len=5, max_len=30):
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    return [[rng.choice(vocab) for _ in range(rng.randint(min_len, max_len))] for _ in range(count)]


def run_alone(llm, prompts, params):
    return [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]


def all_blocks_free(engine):
    bm = engine.block_manager
    return bm.num_free_blocks == bm.num_blocks and all(r == 0 for r in bm.ref_counts)


def make_llm(path, backend):
    return LLM(
        path,
        backend=backend,
        dtype="float32",
        block_size=4,
        prefill_chunk_size=8,
        max_num_batched_tokens=48,
        num_kv_blocks=512,
    )


@pytest.fixture(scope="module")
def llm(tiny_model_dir, backend):
    return make_llm(tiny_model_dir("llama2"), backend)


@pytest.fixture(scope="module", params=FAMILIES)
def family_llm(request, tiny_model_dir, backend):
    return request.param, make_llm(tiny_model_dir(request.param), backend)


def test_staggered_batch_gives_same_tokens_as_alone(family_llm):
    family, llm = family_llm
    engine = llm.engine
    count = 32 if family == "llama2" else 12
    prompts = make_prompts(llm.tokenizer, count)
    assert max(map(len, prompts)) > 8  # longer than the sliding windows
    alone = run_alone(llm, prompts, GREEDY)
    # Requests arrive two per step while others are prefilling in chunks or decoding.
    results, pending, step = {}, list(enumerate(prompts)), 0
    mixed_steps = 0
    while pending or engine.has_unfinished_requests():
        for _ in range(2):
            if pending:
                i, p = pending.pop(0)
                engine.add_request(f"s{i}", p, GREEDY)
        sched_before = len(engine.scheduler.running)
        for out in engine.step():
            if out.finished:
                results[int(out.request_id[1:])] = out.outputs[0].token_ids
        mixed_steps += sched_before > 1
        step += 1
    assert mixed_steps > 10  # batches really held several sequences at once
    assert [results[i] for i in range(count)] == alone
    assert all_blocks_free(engine)


@pytest.mark.parametrize("family", FAMILIES)
def test_preemption_keeps_results_and_frees_everything(tiny_model_dir, backend, family):
    # Each sequence needs ~ (30 + 24) / 4 = 14 blocks; 56 blocks hold about 4 of them. With a
    # window of 8 every layer slides and a sequence holds at most 4 blocks, so a smaller pool and
    # prompts admitted by chunks of 8 (admission checks only the first chunk) make them collide.
    swa = {"num_kv_blocks": 20, "prefill_chunk_size": 8} if family == "mistral_swa" else {"num_kv_blocks": 56}
    llm = LLM(tiny_model_dir(family), backend=backend, dtype="float32", block_size=4, **swa)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    count = 16 if family == "llama2" else 8
    prompts = make_prompts(llm.tokenizer, count, seed=1, min_len=20, max_len=30)
    together = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert llm.engine.scheduler.num_preemptions > 0
    assert together == run_alone(llm, prompts, params)
    assert all_blocks_free(llm.engine)


@pytest.mark.parametrize("family", FAMILIES)
def test_prefix_cache_reuses_blocks_and_changes_nothing(tiny_model_dir, backend, family):
    # With mistral_swa the first request's head blocks are released (behind the window) before the
    # others arrive: their hits read only the last blocks of the 40-token prefix.
    path = tiny_model_dir(family)
    tok_prompts = make_prompts(_tok(path), 1, seed=2, min_len=40, max_len=40)
    prefix = tok_prompts[0]
    suffixes = make_prompts(_tok(path), 6, seed=3, min_len=3, max_len=9)
    prompts = [prefix + s for s in suffixes]
    cached = LLM(path, backend=backend, dtype="float32", block_size=4, num_kv_blocks=256)
    uncached = LLM(path, backend=backend, dtype="float32", block_size=4, num_kv_blocks=256, enable_prefix_caching=False)
    first = cached.generate([prompts[0]], GREEDY)  # fills the cache
    rest = cached.generate(prompts[1:], GREEDY)
    bm = cached.engine.block_manager
    assert bm.prefix_hits >= 5 * 40  # every later prompt found the 40-token prefix cached
    assert all(o.num_cached_tokens == 40 for o in rest)
    ref = uncached.generate(prompts, GREEDY)
    assert uncached.engine.block_manager.prefix_hits == 0
    assert [o.outputs[0].token_ids for o in first + rest] == [o.outputs[0].token_ids for o in ref]


def _tok(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def test_n_samples_share_prompt_blocks(llm):
    engine = llm.engine
    prompt = make_prompts(llm.tokenizer, 1, seed=4, min_len=10, max_len=10)[0]
    single = llm.generate([prompt], GREEDY)[0].outputs[0].token_ids
    engine.block_manager.reset_prefix_cache()
    # Greedy with n=3: the forked siblings must read the same (copied-on-write) prefix.
    out = llm.generate([prompt], SamplingParams(n=3, temperature=0, max_tokens=16, ignore_eos=True))[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert all(o.token_ids == single for o in out.outputs)
    sampled = llm.generate([prompt], SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=16))[0]
    texts = {tuple(o.token_ids) for o in sampled.outputs}
    assert len(texts) > 1  # different samples, not copies
    again = llm.generate([prompt], SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=16))[0]
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in sampled.outputs]
    assert all_blocks_free(engine)


def test_abort_frees_blocks_mid_generation(llm):
    engine = llm.engine
    prompts = make_prompts(llm.tokenizer, 3, seed=5)
    for i, p in enumerate(prompts):
        engine.add_request(f"a{i}", p, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    for _ in range(6):
        engine.step()
    assert engine.block_manager.num_free_blocks < engine.block_manager.num_blocks
    out = engine.abort_request("a1")
    assert out.outputs[0].finish_reason == "abort"
    for rid in ("a0", "a2"):
        engine.abort_request(rid)
    assert not engine.has_unfinished_requests()
    assert all_blocks_free(engine)
