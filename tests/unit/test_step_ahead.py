"""Decode steps scheduled ahead (app/engine/step_ahead.py), on a pure-Python launching backend: step N+1 is launched
before step N's tokens reach the host, its ids carried from N's, and every generation is the one the engine makes
without it -- through preemption, fan-out, stops, aborts and failures."""

from __future__ import annotations

import dataclasses

import pytest

from lantern.app.config import EngineConfig
from lantern.app.engine import SamplingParams
from lantern.app.engine.contract import ScheduledBatch, StepOutput
from lantern.app.engine.engine import LLMEngine
from lantern.backends.base import LaunchingBackend
from tests.unit.test_backend_contract import CountingBackend


class Launched:
    def __init__(self, backend: LaunchingCounting, index: int, tokens: list[int], fails: bool = False) -> None:
        self.backend, self.index, self.tokens, self.fails = backend, index, tokens, fails

    def result(self) -> StepOutput:
        # Steps reach the host in launch order, each once (processed, or dropped by the engine).
        assert self.backend.collected == self.index, "a step collected out of launch order"
        self.backend.collected += 1
        if self.fails:
            raise RuntimeError("the device failed the step")
        return StepOutput(token_ids=list(self.tokens))


class LaunchingCounting(CountingBackend):
    """CountingBackend's model behind launch(): a carried id is resolved from the step launched just before (which
    the engine must name as `after`); a step's tokens reach the engine only through its result()."""

    steps_run_async = True
    carries_tokens = True

    def __init__(self, fail_on: int | None = None, fail_result_on: int | None = None) -> None:
        self.launches: list[Launched] = []
        self.collected = 0
        self.carried_steps = 0
        self.fail_on = fail_on  # a launch computing this token id raises (a request the device cannot run)
        self.fail_result_on = fail_result_on  # ... or the step's result(), once launched

    def launch(self, batch: ScheduledBatch, after: Launched | None = None) -> Launched:
        if batch.carried is not None:
            assert after is not None and after is self.launches[-1]
            ids = batch.input_ids.copy()
            for i, row in enumerate(batch.carried):
                if row >= 0:
                    ids[i] = after.tokens[row]
            batch = dataclasses.replace(batch, input_ids=ids, carried=None)
            self.carried_steps += 1
        if self.fail_on is not None and self.fail_on in batch.input_ids.tolist():
            raise RuntimeError("the device refused the step")
        fails = self.fail_result_on in batch.input_ids.tolist()
        step = Launched(self, len(self.launches), self.execute(batch).token_ids, fails)
        self.launches.append(step)
        return step


def make_engine(tiny_model_dir, backend, **options) -> LLMEngine:
    options = {"block_size": 4, "num_kv_blocks": 64, "max_num_seqs": 8, **options}
    return LLMEngine(EngineConfig(model=tiny_model_dir("llama2"), **options), backend=backend)


def run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]], between=None) -> dict:
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    finals, steps = {}, 0
    while engine.has_unfinished_requests():
        steps += 1
        if between is not None:
            between(engine, steps)
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    return finals


def counting(prompt: list[int], n: int, vocab: int) -> list[int]:
    return [(prompt[-1] + k) % vocab for k in range(1, n + 1)]


def test_the_double_is_a_launching_backend():
    assert isinstance(LaunchingCounting(), LaunchingBackend)


def test_steps_run_ahead_and_every_generation_is_the_same_through_preemption_and_fan_out(tiny_model_dir):
    backend = LaunchingCounting()
    engine = make_engine(tiny_model_dir, backend, num_kv_blocks=16, max_num_seqs=3)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 8, 9, 10, 12], [40, 41]]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, n=2)
    finals = run(engine, {f"r{i}": (p, params) for i, p in enumerate(prompts)})
    for i, p in enumerate(prompts):
        expect = counting(p, 20, engine.vocab_size)
        assert [o.token_ids for o in finals[f"r{i}"].outputs] == [expect, expect]
    assert engine.scheduler.num_preemptions > 0  # (16 blocks of 4 cannot hold three 27-token sequences)
    assert engine.ahead is not None and engine.ahead.launched == backend.carried_steps > 0
    assert backend.collected == len(backend.launches)  # every step launched ahead was collected, none left behind
    assert engine.block_manager.num_free_blocks == 16


def test_a_stopped_sequence_drops_the_token_computed_ahead_and_the_others_go_on(tiny_model_dir):
    backend = LaunchingCounting()
    engine = make_engine(tiny_model_dir, backend)
    vocab = engine.vocab_size
    finals = run(
        engine,
        {
            "stops": ([3, 4, 10], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[17])),
            "runs": ([3, 4, 50], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)),
        },
    )
    stopped = finals["stops"].outputs[0]
    assert stopped.token_ids == list(range(11, 18)) and stopped.finish_reason == "stop"
    assert finals["runs"].outputs[0].token_ids == counting([50], 30, vocab)
    # After the stop the other request still ran ahead (the stopped one left out), and nothing leaked.
    assert backend.carried_steps >= 30 - 2
    assert engine.block_manager.num_free_blocks == 64


def test_a_request_that_needs_its_last_token_holds_the_step_back(tiny_model_dir):
    """Penalties count the tokens on the host and min_tokens bans EOS until it is reached: a step with such a
    sequence is not launched ahead (a step without it would hold it back)."""
    backend = LaunchingCounting()
    engine = make_engine(tiny_model_dir, backend)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, presence_penalty=0.5)
    finals = run(engine, {"pen": ([3, 4, 10], params), "free": ([3, 4, 60], SamplingParams(max_tokens=12))})
    assert finals["pen"].outputs[0].token_ids == list(range(11, 23)) and backend.carried_steps == 0
    backend = LaunchingCounting()
    engine = make_engine(tiny_model_dir, backend)
    finals = run(engine, {"min": ([3, 4, 10], SamplingParams(temperature=0, max_tokens=12, min_tokens=8))})
    assert finals["min"].outputs[0].token_ids == list(range(11, 23))
    # Tokens 2..7 are drawn under the ban; from the 8th on the steps ran ahead, the 12th (its length) left out.
    assert backend.carried_steps == 12 - 8


@pytest.mark.parametrize("ahead", [False, True])
def test_a_waiting_request_is_admitted_by_the_next_step_scheduled(tiny_model_dir, ahead):
    """A request that arrives while a step runs ahead is admitted by the step after it: one step later than without
    (that step was scheduled before it came), and no step is launched ahead while it waits."""
    backend = LaunchingCounting()
    engine = make_engine(tiny_model_dir, backend, async_scheduling=ahead)
    seen: dict[str, int] = {}

    def arrive(engine: LLMEngine, step: int) -> None:
        if step == 5:
            engine.add_request("late", [7, 8, 9], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
            seen["carried"] = backend.carried_steps
        if "running" not in seen and any(s.request_id == "late" for s in engine.scheduler.running):
            seen["running"] = step
        if step == 7:
            seen["carried after"] = backend.carried_steps

    finals = run(engine, {"first": ([3, 4, 10], SamplingParams(temperature=0, max_tokens=20))}, between=arrive)
    assert seen["running"] == (7 if ahead else 6)  # (seen before the step: admitted by step 6, or by step 5)
    if ahead:  # steps 3, 4 and 5 were launched ahead (by steps 2, 3, 4); step 5 launched none, nor step 6 (mixed)
        assert seen["carried"] == 3 and seen["carried after"] == 3
    assert finals["late"].outputs[0].token_ids == counting([9], 10, engine.vocab_size)
    assert finals["first"].outputs[0].token_ids == counting([10], 20, engine.vocab_size)


def test_an_abort_while_a_step_runs_ahead_frees_its_blocks(tiny_model_dir):
    backend = LaunchingCounting()
    engine = make_engine(tiny_model_dir, backend)

    def abort(engine: LLMEngine, step: int) -> None:
        if step == 6:
            assert engine._ahead is not None  # (a step is in flight for both)
            engine.abort_request("a")

    params = SamplingParams(temperature=0, max_tokens=25, ignore_eos=True)
    finals = run(engine, {"a": ([3, 4, 10], params), "b": ([3, 4, 70], params)}, between=abort)
    assert "a" not in finals  # (its abort output went to the caller of abort_request)
    assert finals["b"].outputs[0].token_ids == counting([70], 25, engine.vocab_size)
    assert backend.collected == len(backend.launches) and engine.block_manager.num_free_blocks == 64


@pytest.mark.parametrize("others", [0, 1])
@pytest.mark.parametrize("where", ["launch", "result"])
def test_a_step_failing_ahead_fails_only_its_request(tiny_model_dir, others, where):
    """A step launched ahead that raises at its launch, or when its tokens are read (the next step already launched
    behind it: waited for and dropped), fails its request alone; a step of several is retried one by one."""
    backend = LaunchingCounting(fail_on=20) if where == "launch" else LaunchingCounting(fail_result_on=20)
    engine = make_engine(tiny_model_dir, backend)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    requests = {"bad": ([3, 4, 10], params)} | ({"good": ([3, 4, 80], params)} if others else {})
    finals = run(engine, requests)
    bad = finals["bad"]
    assert bad.outputs[0].finish_reason == "error" and ("refused" if where == "launch" else "failed") in bad.error
    assert bad.outputs[0].token_ids == list(range(11, 21))  # up to the token whose step failed
    if others:
        assert finals["good"].outputs[0].token_ids == counting([80], 20, engine.vocab_size)
    assert engine.stats.requests_failed == 1 and engine.block_manager.num_free_blocks == 64
    assert backend.collected == len(backend.launches) and backend.carried_steps >= 8  # (tokens 3..10 ran ahead)


def test_async_scheduling_false_launches_nothing_ahead(tiny_model_dir):
    backend = LaunchingCounting()
    engine = make_engine(tiny_model_dir, backend, async_scheduling=False)
    finals = run(engine, {"r": ([3, 4, 10], SamplingParams(temperature=0, max_tokens=10))})
    assert finals["r"].outputs[0].token_ids == list(range(11, 21))
    assert engine.ahead is None and backend.carried_steps == 0


def test_a_backend_that_cannot_carry_tokens_is_not_asked_to(tiny_model_dir, caplog):
    backend = LaunchingCounting()
    backend.carries_tokens = False
    engine = make_engine(tiny_model_dir, backend, async_scheduling=True)
    assert engine.ahead is None and "async scheduling: not for this model or backend" in caplog.text
    finals = run(engine, {"r": ([3, 4, 10], SamplingParams(temperature=0, max_tokens=10))})
    assert finals["r"].outputs[0].token_ids == list(range(11, 21)) and backend.carried_steps == 0


def test_steps_run_ahead_while_requests_wait_for_a_sequence_slot(tiny_model_dir):
    """With every sequence slot taken the scheduler would admit no one at the next step either: steps run ahead,
    and the waiting request starts once a slot is free."""
    backend = LaunchingCounting()
    engine = make_engine(tiny_model_dir, backend, max_num_seqs=1)
    params = SamplingParams(temperature=0, max_tokens=15, ignore_eos=True)
    finals = run(engine, {"first": ([3, 4, 10], params), "second": ([3, 4, 90], params)})
    assert finals["first"].outputs[0].token_ids == counting([10], 15, engine.vocab_size)
    assert finals["second"].outputs[0].token_ids == counting([90], 15, engine.vocab_size)
    assert backend.carried_steps >= 2 * (15 - 3)  # (each request: its first two tokens and its last not ahead)
