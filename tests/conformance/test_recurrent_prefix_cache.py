"""Prefix caching for models with recurrent layers (app/engine/state_cache.py): a prompt whose leading blocks
are cached starts from a snapshot of the recurrent state taken at a block boundary, with the attention
layers' K/V from the pool. On both backends, for each kind of recurrent layer (Qwen3-Next / Qwen3.5's
gated delta rule, LFM2's short convolutions, Granite 4.0-H's and Nemotron-H's Mamba-2 mixers), what such a
prompt computes equals transformers' forward pass over the whole of it, and the cache never serves a prompt
a state it does not own (another tenant's, an evicted one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM, SamplingParams
from tests.fixtures.failures import fail_once_after_forward
from tests.fixtures.teacher_forcing import teacher_forced_logits

BS = 4  # block size: snapshots land every 4 tokens, so the prompts below cross many boundaries
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _llm(path: str, backend: str, **options) -> LLM:
    opts = dict(dtype="float32", block_size=BS, num_kv_blocks=256, prefill_chunk_size=16)
    return LLM(path, backend=backend, **(opts | options))


def _tokens(llm: LLM, rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(10, llm.engine.vocab_size, n).tolist()


def _assert_forced_logits_match_transformers(llm: LLM, path: str, prompt: list[int], rng, request_id="tf") -> None:
    """The prompt's last position and 4 teacher-forced tokens, each equal to transformers' logits."""
    from transformers import AutoModelForCausalLM

    forced = _tokens(llm, rng, 4)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = ref(torch.tensor([prompt + forced])).logits[0].numpy()
    rows = list(teacher_forced_logits(llm.engine, prompt, forced, request_id))
    assert [pos for pos, _ in rows] == list(range(len(prompt) - 1, len(prompt) + 3))
    for pos, logits in rows:
        np.testing.assert_allclose(logits, expected[pos], atol=1e-4, rtol=0, err_msg=f"position {pos}")


def _copies_after(failed: list[int], backend) -> list[tuple[int, int]]:
    """The state copies the backend is asked for once `failed` (fail_once_after_forward's record) is set."""
    copy, copies = backend.copy_state_slots, []

    def watched_copy(pairs):
        if failed:
            copies.extend(pairs)
        copy(pairs)

    backend.copy_state_slots = watched_copy
    return copies


def _cached_tokens(llm: LLM, prompt: list[int], **add) -> int:
    """Run one request to the end; the prompt tokens the prefix cache served it."""
    engine = llm.engine
    engine.add_request("probe", prompt, GREEDY, **add)
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = out if out.finished else final
    assert final is not None and final.error is None
    return final.num_cached_tokens


@pytest.mark.parametrize(
    "variant", ["qwen3_next", "qwen3_5", "lfm2", "lfm2_moe", "granite_hybrid", "nemotron_h", "falcon_h1"]
)
def test_a_follow_up_turn_starts_from_the_snapshot_and_matches_transformers(tiny_model_dir, backend, variant):
    """Turn 2 = turn 1's prompt + its reply + a new message: its state is restored at the last block boundary of
    turn 1's reply (32: 30 prompt tokens and 5 of the 6 reply tokens were computed) and everything after it
    equals transformers over the whole prompt. A turn 2 whose reply differs (a template that rewrites it)
    starts from turn 1's prompt snapshot (28 of 30 tokens) instead."""
    path = tiny_model_dir(variant)
    llm = _llm(path, backend)
    rng = np.random.default_rng(1)
    first = _tokens(llm, rng, 30)
    reply = llm.generate([first], GREEDY)[0].outputs[0].token_ids
    follow_up = first + reply + _tokens(llm, rng, 7)
    bm, states = llm.engine.block_manager, llm.engine.scheduler.states
    assert states is not None and llm.engine.config.enable_prefix_caching
    hits = bm.prefix_hits
    rewritten = first + [(reply[0] + 1) % llm.engine.vocab_size] + reply[1:] + _tokens(llm, rng, 7)
    _assert_forced_logits_match_transformers(llm, path, rewritten, rng, "rewritten")
    assert bm.prefix_hits - hits == 28  # (30 - 1) // 4 * 4: the prompt snapshot's boundary
    hits = bm.prefix_hits
    _assert_forced_logits_match_transformers(llm, path, follow_up, rng)
    assert bm.prefix_hits - hits == 32  # the reply's last boundary (not the 36 cached tokens)
    assert states.restores == 2
    # Through LLMEngine.step too: the same tokens and log-probabilities as an engine without a prefix cache.
    with_logprobs = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    cached = llm.generate([follow_up], with_logprobs)[0]
    afresh = _llm(path, backend, enable_prefix_caching=False).generate([follow_up], with_logprobs)[0]
    assert cached.num_cached_tokens == 40 and states.restores == 3  # the forced run's snapshot at (43 - 1) // 4 * 4
    assert cached.outputs[0].token_ids == afresh.outputs[0].token_ids
    np.testing.assert_allclose(
        [lp.logprob for lp in cached.outputs[0].logprobs], [lp.logprob for lp in afresh.outputs[0].logprobs], atol=1e-4
    )


@pytest.mark.parametrize("variant", ["qwen3_5", "lfm2", "granite_hybrid"])
def test_prompts_sharing_a_system_prompt_leave_a_snapshot_where_they_part(tiny_model_dir, backend, variant):
    """Three prompts over one 22-token system prompt: the first leaves a snapshot at its own end only, the
    second finds the shared blocks cached but no state for them, computes from 0 and leaves one at the
    shared blocks' end (20 tokens), where the third starts, computing what transformers computes."""
    path = tiny_model_dir(variant)
    llm = _llm(path, backend)
    rng = np.random.default_rng(2)
    system = _tokens(llm, rng, 22)
    assert _cached_tokens(llm, system + _tokens(llm, rng, 10)) == 0
    assert _cached_tokens(llm, system + _tokens(llm, rng, 9)) == 0
    hits = llm.engine.block_manager.prefix_hits
    _assert_forced_logits_match_transformers(llm, path, system + _tokens(llm, rng, 12), rng)
    assert llm.engine.block_manager.prefix_hits - hits == 20


def test_tenants_and_evicted_snapshots_are_never_served(tiny_model_dir, backend):
    """Another cache salt (tenant) finds nothing; with one snapshot slot, a newer prompt's snapshot (the
    other tenant's too) evicts the older one, whose prompt is then computed from position 0 again (and
    still answers the same)."""
    path = tiny_model_dir("granite_hybrid")
    llm = _llm(path, backend, prefix_cache_states=1)
    assert llm.engine.scheduler.states.count == 1
    rng = np.random.default_rng(3)
    a, b = _tokens(llm, rng, 26), _tokens(llm, rng, 26)
    want = llm.generate([a], GREEDY)[0].outputs[0].token_ids
    assert _cached_tokens(llm, a, cache_salt="tenant-2") == 0
    assert _cached_tokens(llm, a) == 0  # tenant 2's snapshot took the only slot
    assert _cached_tokens(llm, a) == 24  # the previous request's snapshot at (26 - 1) // 4 * 4
    assert _cached_tokens(llm, b) == 0  # its snapshot takes the only slot
    out = llm.generate([a], GREEDY)[0]
    assert out.num_cached_tokens == 0 and out.outputs[0].token_ids == want


def test_no_room_for_a_snapshot_turns_prefix_caching_off(tiny_model_dir, backend, caplog):
    import logging

    with caplog.at_level(logging.INFO):
        llm = _llm(tiny_model_dir("lfm2"), backend, prefix_cache_states=0)
    assert not llm.engine.config.enable_prefix_caching and llm.engine.scheduler.states is None
    assert "prefix caching is off" in caplog.text


def test_a_failed_decode_step_is_retried_from_the_sequences_own_decode_snapshot(tiny_model_dir, backend):
    """A batch fails 8 tokens into decoding, past a block boundary where each sequence holding a decode snapshot
    moved it: the retry copies that snapshot back into its slot and recomputes only from there (neither
    prompt was cached at admission, so without it the retry starts from 0), and the answers do not change."""
    path = tiny_model_dir("lfm2")
    rng = np.random.default_rng(5)
    llm = _llm(path, backend)
    prompts = [_tokens(llm, rng, 9), _tokens(llm, rng, 13)]
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in _llm(path, backend, enable_prefix_caching=False).generate(prompts, params)]
    failed = fail_once_after_forward(llm.engine.backend, skip=8)
    copies_after_failure = _copies_after(failed, llm.engine.backend)
    outs = llm.generate(prompts, params)
    assert failed, "the injected failure never ran"
    assert [o.outputs[0].token_ids for o in outs] == want and all(o.num_cached_tokens == 0 for o in outs)
    first = llm.engine.scheduler.states.first
    restored = [(src, dst) for src, dst in copies_after_failure if src >= first > dst]
    assert restored, "the retry did not restore a decode snapshot"


def test_a_failed_step_is_retried_from_the_snapshot_the_sequence_started_from(tiny_model_dir, backend):
    """A batch fails after its forward pass moved the states on: the one-by-one retry copies the snapshot a
    cached sequence started from into its slot again before recomputing from there (its state now holds
    tokens past the snapshot: recomputing them onto it would apply them twice)."""
    path = tiny_model_dir("qwen3_next")
    rng = np.random.default_rng(4)
    llm = _llm(path, backend, prefill_chunk_size=5)
    base = _tokens(llm, rng, 21)
    prompts = [base + _tokens(llm, rng, 6), _tokens(llm, rng, 12)]
    alone = _llm(path, backend, enable_prefix_caching=False)
    want = [alone.generate([p], GREEDY)[0].outputs[0].token_ids for p in prompts]
    llm.generate([base], GREEDY)  # a snapshot at 20
    failed = fail_once_after_forward(llm.engine.backend)
    copies_after_failure = _copies_after(failed, llm.engine.backend)
    outs = llm.generate(prompts, GREEDY)
    assert failed, "the injected failure never ran"
    assert outs[0].num_cached_tokens == 20
    assert [o.outputs[0].token_ids for o in outs] == want
    first = llm.engine.scheduler.states.first  # snapshot slots are numbered from here
    assert any(src >= first > dst for src, dst in copies_after_failure), "the retry did not restore the snapshot"
