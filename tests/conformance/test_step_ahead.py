"""Async scheduling (app/engine/step_ahead.py) on both backends: with decode steps launched ahead -- their ids
carried on the device from the step before -- every request's tokens and logprobs are the ones the engine gives
without, across sampling modes, stops, fan-out, penalties and preemption. MLX schedules ahead by default; the
torch backend does on CUDA, and is told to here (eagerly and through the CUDA-graph runner's static buffers)."""

from __future__ import annotations

import pytest

from lantern.app.config import EngineConfig
from lantern.app.engine import SamplingParams
from lantern.app.engine.engine import LLMEngine
from tests.conformance.test_scheduling import make_prompts


def make_engine(path: str, backend: str, ahead: bool, graphs: bool = False, **options) -> LLMEngine:
    config = EngineConfig(model=path, backend=backend, dtype="float32", block_size=4, async_scheduling=ahead, **options)
    if not graphs:
        return LLMEngine(config)
    from lantern.backends.torch.runner import TorchBackend

    return LLMEngine(config, backend=TorchBackend(static_decode=True))  # (the graph runner's buffers, uncaptured)


def generate(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> list:
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", prompt, p)
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    return [finals[f"r{i}"] for i in range(len(prompts))]


def outcome(out) -> list:
    """What a request got, its logprobs apart (compare_logprobs): a sequence that a stop ends had a token computed
    ahead in vain, so a step ahead may hold a row more than the same step without -- another padding bucket in the
    graph runner, float32 sums in another order, logprobs within ~1e-6."""
    return [
        (o.token_ids, o.text, o.finish_reason, [(lp.token_id, lp.top.keys()) for lp in o.logprobs or []])
        for o in out.outputs
    ]


def logprobs(out) -> list[float]:
    return [v for o in out.outputs for lp in o.logprobs or [] for v in (lp.logprob, *lp.top.values())]


def mixed_requests(engine: LLMEngine, count: int = 9) -> tuple[list[list[int]], list[SamplingParams]]:
    """Greedy and sampled rows, top-p, logprobs, n=2, a presence penalty, min_tokens, and stops -- a stop string and
    stop tokens taken from what a run without them says, so that they end those requests part way. (The penalty and
    min_tokens hold every step back while they last -- their tokens are needed on the host -- so they end early.)"""
    prompts = make_prompts(engine.tokenizer, count, seed=7, min_len=3, max_len=14)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    fan_out = SamplingParams(temperature=1.0, seed=6, max_tokens=15, n=2, ignore_eos=True)
    probe = generate(engine, prompts[:2] + prompts[5:6], [greedy, greedy, fan_out])
    text, tokens = probe[0].outputs[0].text, probe[1].outputs[0].token_ids
    stop_text = text[len(text) // 2 : len(text) // 2 + 3]
    # A token of the first sample that the second never draws: one sample stops part way, its sibling goes on.
    first, second = (o.token_ids for o in probe[2].outputs)
    sibling_stop = next(t for t in first[6:] if t not in second)
    return prompts, [
        SamplingParams(temperature=0, max_tokens=24, stop=[stop_text] if stop_text.strip() else None),
        SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[tokens[9]]),
        SamplingParams(temperature=1.0, seed=3, max_tokens=31, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, seed=4, max_tokens=17, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=5, max_tokens=20, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=6, max_tokens=15, n=2, stop_token_ids=[sibling_stop], ignore_eos=True),
        SamplingParams(temperature=1.0, seed=8, max_tokens=3, presence_penalty=0.7, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=9, max_tokens=18, min_tokens=3),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
    ][:count]


def check_same_outputs(path: str, backend: str, graphs: bool = False) -> None:
    plain = make_engine(path, backend, False, graphs, num_kv_blocks=256)
    prompts, params = mixed_requests(plain)
    want = generate(plain, prompts, params)
    ahead = make_engine(path, backend, True, graphs, num_kv_blocks=256)
    got = generate(ahead, prompts, params)
    assert [outcome(o) for o in got] == [outcome(o) for o in want]
    for g, w in zip(got, want, strict=True):
        assert logprobs(g) == pytest.approx(logprobs(w), abs=1e-5)
    assert logprobs(got[4])  # (the request that asks for them)
    assert ahead.ahead is not None and ahead.ahead.launched > 20
    # The stops ended requests, and one of two samples, while steps ran ahead.
    assert any(o.outputs[0].finish_reason == "stop" for o in want[:2])
    assert [o.finish_reason for o in want[5].outputs] == ["stop", "length"]
    assert ahead.block_manager.num_free_blocks == 256


def test_steps_scheduled_ahead_give_the_same_outputs(tiny_model_dir, backend):
    check_same_outputs(tiny_model_dir("llama3"), backend)


def test_steps_scheduled_ahead_through_the_graph_runners_buffers(tiny_model_dir):
    """torch: decode steps through the CUDA-graph runner's static buffers, its carried ids taken there."""
    pytest.importorskip("torch")
    check_same_outputs(tiny_model_dir("qwen2"), "torch", graphs=True)


def test_steps_scheduled_ahead_under_preemption(tiny_model_dir, backend):
    """A pool too small for every sequence at once: steps that would need a preemption are scheduled as before."""
    path = tiny_model_dir("llama3")
    prompts = make_prompts(make_engine(path, backend, False, num_kv_blocks=40).tokenizer, 6, seed=2, max_len=14)
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=36, ignore_eos=True) for i in range(6)]
    engines = [make_engine(path, backend, ahead, num_kv_blocks=40, max_num_seqs=6) for ahead in (False, True)]
    want, got = ([outcome(o) for o in generate(e, prompts, params)] for e in engines)
    assert got == want
    assert engines[1].scheduler.num_preemptions > 0 and engines[1].ahead.launched > 0
    assert engines[1].block_manager.num_free_blocks == 40


def test_mlx_schedules_ahead_by_default_and_torch_on_a_cpu_does_not(tiny_model_dir, backend):
    engine = LLMEngine(EngineConfig(model=tiny_model_dir("llama2"), backend=backend, num_kv_blocks=64))
    assert (engine.ahead is not None) == (backend == "mlx")
