"""Sampling semantics on a real model, on each backend: seeds, top-k, logprobs, stops, penalties
(against transformers' processors and the OpenAI formula), streaming."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
)

from lantern.app.engine import LLM, AsyncEngine, SamplingParams
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
    alone = [tokens(llm.generate([p], q))[0] for p, q in zip(prompts, params, strict=True)]
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
    params = SamplingParams(temperature=0.7, seed=3, max_tokens=8, logprobs=5, ignore_eos=True)
    out = llm.generate([prompt], params)[0].outputs[0]
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
    by_id = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[stop_id])
    )[0].outputs[0]
    k = free.token_ids.index(stop_id)
    assert by_id.token_ids == free.token_ids[: k + 1]
    assert by_id.finish_reason == "stop" and by_id.stop_reason == stop_id
    # min_tokens bans the stop token until enough tokens are out.
    late = llm.generate(
        [prompt],
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[stop_id], min_tokens=k + 2),
    )[0].outputs[0]
    assert stop_id not in late.token_ids[: k + 2]
    assert len(late.token_ids) >= k + 2


def test_max_tokens_finish_reason_length(llm):
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    out = llm.generate(make_prompts(llm.tokenizer, 1, seed=15), params)
    assert out[0].outputs[0].finish_reason == "length" and len(out[0].outputs[0].token_ids) == 5


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's formula, written out here: mu[j] - c[j] * frequency - (c[j] > 0) * presence, with c[j]
    counting token j among the generated tokens only."""

    def __init__(self, prompt_len: int, frequency: float, presence: float) -> None:
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        for b in range(scores.shape[0]):
            c = torch.bincount(input_ids[b, self.prompt_len :], minlength=scores.shape[1])[: scores.shape[1]]
            out[b] -= c.to(scores.dtype) * self.frequency + (c > 0).to(scores.dtype) * self.presence
        return out


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir("qwen2"), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # never stop early, as ignore_eos
    return model


def hf_greedy(hf, prompt: list[int], n: int, **kw) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0, **kw)
    return out[0, len(prompt) :].tolist()


def test_repetition_penalty_decodes_as_transformers(llm, hf):
    prompts = make_prompts(llm.tokenizer, 2, seed=16)
    n = 30
    plain = tokens(llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)))
    for penalty in (1.8, 0.7):  # < 1 favours repeats
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, repetition_penalty=penalty)
        got = tokens(llm.generate(prompts, params))
        assert got != plain  # the penalty is in play on these prompts
        assert got == [hf_greedy(hf, p, n, repetition_penalty=penalty) for p in prompts]


def test_frequency_and_presence_penalties_decode_as_the_openai_formula(llm, hf):
    prompts = make_prompts(llm.tokenizer, 2, seed=18)
    n = 30
    plain = tokens(llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)))
    for freq, pres in ((0.9, 0.0), (0.0, 1.5), (1.5, -0.5), (-2.0, 0.0)):
        params = SamplingParams(
            temperature=0, max_tokens=n, ignore_eos=True, frequency_penalty=freq, presence_penalty=pres
        )
        got = tokens(llm.generate(prompts, params))
        ref = [
            hf_greedy(hf, p, n, logits_processor=LogitsProcessorList([OpenAIPenalties(len(p), freq, pres)]))
            for p in prompts
        ]
        assert got == ref, (freq, pres)
        assert got != plain, (freq, pres)


def test_penalized_samples_of_one_request_keep_their_own_counts(llm):
    """n samples each keep their own penalty state: sample i equals the lone request seeded seed+i."""
    prompt = make_prompts(llm.tokenizer, 1, seed=19)[0]
    kw = {"temperature": 1.0, "max_tokens": 16, "ignore_eos": True, "frequency_penalty": 1.5, "repetition_penalty": 1.3}
    fan = llm.generate([prompt], SamplingParams(n=3, seed=40, **kw))[0].outputs
    alone = [tokens(llm.generate([prompt], SamplingParams(seed=40 + i, **kw)))[0] for i in range(3)]
    assert [o.token_ids for o in sorted(fan, key=lambda o: o.index)] == alone
    assert len({tuple(t) for t in alone}) == 3


def test_penalized_logits_equal_the_reference_processors(backend):
    """The sampler's edited logits (all penalties at once, one row each) against transformers'
    RepetitionPenaltyLogitsProcessor followed by the OpenAI formula."""
    from lantern.app.engine.contract import SamplingRow
    from lantern.app.engine.penalty_state import PenaltyState
    from lantern.backends.sampling_prep import prepare_sampling
    from tests.conformance.test_sampler_draws import Sampler

    sampler = Sampler(backend)
    rng = np.random.default_rng(8)
    vocab = 300
    logits = (rng.standard_normal((4, vocab)) * 3).astype(np.float32)
    kws = [
        {"repetition_penalty": 1.6},
        {"frequency_penalty": 0.8, "presence_penalty": 0.5},
        {"repetition_penalty": 0.6, "frequency_penalty": -1.0, "presence_penalty": 2.0},
        {},
    ]
    rows, expected = [], []
    for i, kw in enumerate(kws):
        prompt, output = rng.integers(0, vocab, 40).tolist(), rng.integers(0, vocab, 60).tolist()
        params = SamplingParams(**kw)
        state = PenaltyState(prompt)
        for t in output:  # grown token by token, as in decoding
            state.append(t)
        penalty = state if params.uses_penalties else None
        rows.append(SamplingRow(params=params, seed=i, step=len(output), penalty=penalty))
        ref = torch.from_numpy(logits[i : i + 1].copy())
        ids = torch.tensor([prompt + output])
        ref = RepetitionPenaltyLogitsProcessor(kw.get("repetition_penalty", 1.0))(ids, ref)
        pen = OpenAIPenalties(len(prompt), kw.get("frequency_penalty", 0.0), kw.get("presence_penalty", 0.0))
        expected.append(pen(ids, ref)[0].numpy())
    edited = sampler.mod._edit_logits(sampler.to(logits.copy()), prepare_sampling(rows, vocab))
    got = sampler.back(edited)
    assert np.allclose(got, np.stack(expected), atol=1e-5)
    assert not np.allclose(got[:3], logits[:3], atol=0.1)  # each penalized row really changed
    assert np.array_equal(got[3], logits[3])


def test_sampling_params_reject_bad_values():
    for kwargs, field in [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -3}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 50}, "logprobs"),
        ({"stop": [""]}, "stop"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_tokens": 9, "max_tokens": 3}, "min_tokens"),
    ]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kwargs)


def test_async_engine_streams_and_abort_on_disconnect(llm):
    prompt = make_prompts(llm.tokenizer, 1, seed=17)[0]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = llm.generate([prompt], params)[0].outputs[0]
    llm.engine.block_manager.reset_prefix_cache()
    # Only now: the AsyncEngine's thread steps the engine whenever it holds requests, so an
    # llm.generate() running beside it would race it for the outputs.
    engine = AsyncEngine(llm.engine)

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
