"""Sampling semantics on a real MLX model: seeds, top-k, logprobs, stops, penalties, streaming."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from app.engine import LLM, AsyncEngine, SamplingParams
from tests.conformance.test_scheduling import make_prompts



@pytest.fixture(scope="module")
def llm(tiny_model_dir, backend):
    return LLM(tiny_model_dir("qwen2"), backend=backend, dtype="float32", block_size=8, num_kv_blocks=512)


def tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_seeded_sampling_reproducible_alone_and_batched(llm):
    prompts = make_prompts(llm.tokenizer, 6, seed=10)
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=20) for i in range(6)]
    batched = tokens(llm.generate(prompts, params))
    alone = [tokens(llm.generate([p], q))[0] for p, q in zip(prompts, params)]
    assert batched == alone
    other_seed = tokens(llm.generate([prompts[0]], SamplingParams(temperature=0.9, seed=999, max_tokens=20)))[0]
    assert other_seed != batched[0]


def test_top_k_one_equals_greedy(llm):
    prompts = make_prompts(llm.tokenizer, 4, seed=11)
    greedy = tokens(llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)))
    top1 = tokens(llm.generate(prompts, SamplingParams(temperature=1.5, top_k=1, max_tokens=16, ignore_eos=True)))
    assert top1 == greedy


def test_min_p_one_and_tiny_top_p_are_greedy(llm):
    prompts = make_prompts(llm.tokenizer, 3, seed=12)
    greedy = tokens(llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)))
    tiny_p = tokens(llm.generate(prompts, SamplingParams(temperature=1, top_p=1e-6, max_tokens=12, ignore_eos=True)))
    min_p = tokens(llm.generate(prompts, SamplingParams(temperature=1, min_p=1.0, max_tokens=12, ignore_eos=True)))
    assert tiny_p == greedy and min_p == greedy


def test_logprobs_are_model_log_probabilities(llm, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    prompt = make_prompts(llm.tokenizer, 1, seed=13)[0]
    out = llm.generate([prompt], SamplingParams(temperature=0.7, seed=3, max_tokens=8, logprobs=5))[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids) == 8
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir("qwen2"), dtype=torch.float32)
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + out.token_ids])).logits[0]
    ref = torch.log_softmax(logits, dim=-1).numpy()
    assert np.allclose(np.logaddexp.reduce(ref, axis=-1), 0.0, atol=1e-5)
    for i, lp in enumerate(out.logprobs):
        pos = len(prompt) - 1 + i
        assert lp.token_id == out.token_ids[i]
        assert abs(lp.logprob - ref[pos, lp.token_id]) < 1e-4
        top = sorted(lp.top.items(), key=lambda kv: -kv[1])
        assert len(top) == 5
        assert [t for t, _ in top] == list(np.argsort(-ref[pos])[:5])
        assert all(abs(v - ref[pos, t]) < 1e-4 for t, v in top)


def test_stop_string_and_stop_token(llm):
    prompt = make_prompts(llm.tokenizer, 1, seed=14)[0]
    free = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].outputs[0]
    text = free.text
    assert len(text) > 12
    stop = text[6:9]
    first = text.find(stop)
    cut = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop]))[0]
    o = cut.outputs[0]
    assert o.finish_reason == "stop" and o.stop_reason == stop
    assert o.text == text[:first]
    stop_id = free.token_ids[5]
    by_id = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                                  stop_token_ids=[stop_id]))[0].outputs[0]
    k = free.token_ids.index(stop_id)
    assert by_id.token_ids == free.token_ids[: k + 1]
    assert by_id.finish_reason == "stop" and by_id.stop_reason == stop_id
    # min_tokens bans the stop token until enough tokens are out.
    late = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True,
                                                 stop_token_ids=[stop_id], min_tokens=k + 2))[0].outputs[0]
    assert stop_id not in late.token_ids[: k + 2]
    assert len(late.token_ids) >= k + 2


def test_max_tokens_finish_reason_length(llm):
    out = llm.generate(make_prompts(llm.tokenizer, 1, seed=15), SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert out[0].outputs[0].finish_reason == "length" and len(out[0].outputs[0].token_ids) == 5


def test_penalties_change_the_distribution(llm):
    prompt = make_prompts(llm.tokenizer, 1, seed=16)[0]
    base = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = tokens(llm.generate([prompt], base))[0]
    rep = tokens(llm.generate([prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                                      repetition_penalty=5.0)))[0]
    pres = tokens(llm.generate([prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True,
                                                       presence_penalty=2.0, frequency_penalty=2.0)))[0]
    repeats = lambda t: len(t) - len(set(t))  # noqa: E731
    assert repeats(rep) < repeats(plain) or repeats(plain) == 0
    assert repeats(pres) <= repeats(plain)
    assert rep != plain or pres != plain


def test_sampling_params_reject_bad_values():
    for kwargs, field in [
        ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": -3}, "top_k"),
        ({"min_p": 2}, "min_p"), ({"n": 0}, "n"), ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 50}, "logprobs"), ({"stop": [""]}, "stop"), ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_tokens": 9, "max_tokens": 3}, "min_tokens"),
    ]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kwargs)


def test_async_engine_streams_and_abort_on_disconnect(llm):
    engine = AsyncEngine(llm.engine)
    prompt = make_prompts(llm.tokenizer, 1, seed=17)[0]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = llm.generate([prompt], params)[0].outputs[0]
    llm.engine.block_manager.reset_prefix_cache()

    async def stream():
        deltas, last = [], None
        async for out in engine.generate(prompt, params):
            deltas.append(out.outputs[0].text_delta)
            last = out
        return "".join(deltas), last

    async def disconnect():
        gen = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
        n = 0
        async for _ in gen:
            n += 1
            if n == 3:
                break
        await gen.aclose()
        for _ in range(100):  # the abort is applied before the engine's next step
            await asyncio.sleep(0.02)
            if not llm.engine.has_unfinished_requests():
                break

    try:
        text, last = asyncio.run(stream())
        assert last.finished and text == expected.text and last.outputs[0].token_ids == expected.token_ids
        asyncio.run(disconnect())
        assert not llm.engine.has_unfinished_requests()
        bm = llm.engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks
        with pytest.raises(ValueError, match="prompt"):
            asyncio.run(anext(engine.generate([], params)))
    finally:
        engine.shutdown()
