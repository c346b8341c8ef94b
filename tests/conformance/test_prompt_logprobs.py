"""prompt_logprobs (vLLM's; the server's echo with logprobs): every prompt token's log-probability given the tokens
before it, and the most likely tokens there, equal transformers' log-softmax at the position before -- computed over
several prefill chunks, beside other sequences, with the prompt already in the prefix cache, on each backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM, InvalidRequestError, SamplingParams
from tests.conformance.test_parity import hf_model
from tests.conformance.test_scheduling import make_prompts
from tests.fixtures.failures import wrap_steps


@pytest.fixture(scope="module")
def llm(tiny_model_dir, backend):
    # prefill chunks of 8: a 30-token prompt is scored over four steps
    return LLM(tiny_model_dir("qwen2"), backend=backend, dtype="float32", block_size=8, prefill_chunk_size=8)


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return hf_model(tiny_model_dir("qwen2"))


def _assert_scored(scored, prompt, reference, top: int) -> None:
    with torch.no_grad():
        ref = torch.log_softmax(reference(torch.tensor([prompt])).logits[0], dim=-1).numpy()
    assert len(scored) == len(prompt) and scored[0] is None  # (the first token has nothing before it)
    for j in range(1, len(prompt)):
        lp = scored[j]
        assert lp.token_id == prompt[j]
        assert abs(lp.logprob - ref[j - 1, prompt[j]]) < 1e-4, f"position {j}"
        best = sorted(lp.top.items(), key=lambda kv: -kv[1])
        assert [t for t, _ in best] == list(np.argsort(-ref[j - 1])[:top])
        assert all(abs(v - ref[j - 1, t]) < 1e-4 for t, v in best)


def test_prompt_logprobs_equal_transformers_over_chunks(llm, reference):
    prompt = make_prompts(llm.tokenizer, 1, seed=21, min_len=30, max_len=30)[0]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=3))[0]
    _assert_scored(out.prompt_logprobs, prompt, reference, top=3)
    plain = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=3))[0]
    assert plain.prompt_logprobs is None and plain.outputs[0].token_ids == out.outputs[0].token_ids


def test_a_cached_prompt_is_still_scored_whole_beside_other_sequences(llm, reference):
    """The prompt was served and cached just before: the scored request computes it again (a cached block has no
    logits); its neighbours in the batch (one asking for fewer alternatives, one for none) are scored their way."""
    prompts = make_prompts(llm.tokenizer, 3, seed=22, min_len=12, max_len=26)
    llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=2))  # now in the prefix cache
    params = [
        SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2),
        SamplingParams(temperature=0.8, seed=1, max_tokens=4, prompt_logprobs=0, n=2),
        SamplingParams(temperature=0, max_tokens=2),
    ]
    outs = llm.generate(prompts, params)
    assert outs[0].num_cached_tokens == 0
    _assert_scored(outs[0].prompt_logprobs, prompts[0], reference, top=2)
    _assert_scored(outs[1].prompt_logprobs, prompts[1], reference, top=0)
    assert outs[2].prompt_logprobs is None and len(outs[1].outputs) == 2
    # the scored prompt's blocks were published: a later request reads them
    again = llm.generate([prompts[1]], SamplingParams(temperature=0, max_tokens=1))[0]
    assert again.num_cached_tokens == (len(prompts[1]) - 1) // 8 * 8 > 0


def test_the_scored_rows_of_a_step_are_capped_and_every_position_still_scored(llm, reference, monkeypatch):
    """Each scored position holds a vocabulary of logits at once: a step computes at most SCORED_ROWS_PER_STEP of
    them (here 5), the prompts taking more steps, every position scored once."""
    from lantern.app.engine import scheduler

    monkeypatch.setattr(scheduler, "SCORED_ROWS_PER_STEP", 5)
    rows = []

    def counted(batch, run):
        rows.append(sum(len(r.targets) for r in batch.prompt_rows))
        return run()

    backend = llm.engine.backend
    monkeypatch.setattr(backend, "execute", backend.execute)  # (undone after the test, launch too)
    monkeypatch.setattr(backend, "launch", backend.launch)
    wrap_steps(backend, counted)
    prompts = make_prompts(llm.tokenizer, 3, seed=23, min_len=14, max_len=22)
    params = [SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1) for _ in prompts[:2]]
    outs = llm.generate(prompts, [*params, SamplingParams(temperature=0, max_tokens=2)])
    assert max(rows) == 5 and sum(rows) == sum(len(p) - 1 for p in prompts[:2])
    for prompt, out in zip(prompts[:2], outs, strict=False):
        _assert_scored(out.prompt_logprobs, prompt, reference, top=1)
    assert outs[2].prompt_logprobs is None


def test_out_of_range_is_refused_by_name():
    with pytest.raises(InvalidRequestError, match="prompt_logprobs") as err:
        SamplingParams(prompt_logprobs=21)
    assert err.value.param == "prompt_logprobs"
