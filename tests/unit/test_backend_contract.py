"""A backend needs only what backends/base.py declares: a pure-Python test double implementing
exactly that runs the real engine (scheduler, block manager, fan-out, preemption) end to end."""

from __future__ import annotations

import numpy as np
import pytest

from lantern.app.config import EngineConfig
from lantern.app.engine import SamplingParams
from lantern.app.engine.contract import ModelInfo, ModelSpec, ScheduledBatch, StepOutput
from lantern.app.engine.engine import LLMEngine
from lantern.backends.base import Backend, LaunchingBackend

DECLARED = {
    "name",
    "kv_memory_is_lazy",
    "default_step_tokens",
    "load",
    "kv_bytes_per_block",
    "available_memory_bytes",
    "state_bytes_per_seq",
    "allocate_kv",
    "copy_state_slots",
    "compute_logits",
    "execute",
    "shutdown",
}
# What a backend may add so that decode steps are scheduled ahead (the engine asks whether it has them).
LAUNCHING = {"steps_run_async", "carries_tokens", "launch"}


class CountingBackend:
    """Next token = (last token + 1) % vocab. It checks that every block it is told to read was
    written earlier (by this sequence or a cached prefix), like a real paged pool would need."""

    name = "counting"
    kv_memory_is_lazy = False
    default_step_tokens = 64

    def load(self, spec: ModelSpec) -> ModelInfo:
        self.vocab = spec.config.vocab_size
        return ModelInfo(num_params=0, weight_bytes=0, max_model_len=spec.config.max_context, vocab_size=self.vocab)

    def kv_bytes_per_block(self, block_size: int) -> int:
        return block_size * 8

    def available_memory_bytes(self) -> int:
        return 1 << 20

    def state_bytes_per_seq(self) -> int:
        return 0

    def allocate_kv(self, num_blocks: int, block_size: int, max_num_seqs: int, state_slots: int) -> None:
        self.slots = np.full(num_blocks * block_size, -1, dtype=np.int64)  # token id held by each slot

    def copy_state_slots(self, pairs: list[tuple[int, int]]) -> None:
        raise AssertionError("a model without recurrent state has no state slots to copy")

    def compute_logits(self, batch: ScheduledBatch) -> np.ndarray:
        self.slots[batch.slot_mapping] = batch.input_ids
        logits = np.zeros((len(batch.sample_seq_indices), self.vocab), dtype=np.float32)
        for row, i in enumerate(batch.sample_seq_indices):
            table, n = batch.block_tables[i], int(batch.seq_lens[i])
            context = [
                self.slots[table[p // batch.block_size] * batch.block_size + p % batch.block_size] for p in range(n)
            ]
            assert -1 not in context, "a sequence reads a slot nobody wrote"
            logits[row, (context[-1] + 1) % self.vocab] = 1.0
        return logits

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        return StepOutput(token_ids=[int(t) for t in self.compute_logits(batch).argmax(axis=-1)])

    def shutdown(self) -> None:
        self.slots = None


class Watched:
    """Forwards to the double and records which attributes the engine touches."""

    def __init__(self, inner: CountingBackend):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "touched", set())

    def __getattr__(self, name: str):
        self.touched.add(name)
        return getattr(self._inner, name)


def test_the_double_satisfies_the_declared_contract():
    assert isinstance(CountingBackend(), Backend)
    assert {m for m in dir(Backend) if not m.startswith("_")} | set(Backend.__annotations__) == DECLARED
    assert {m for m in dir(LaunchingBackend) if not m.startswith("_")} | set(LaunchingBackend.__annotations__) == (
        LAUNCHING
    )


def test_the_engine_runs_on_the_double_using_only_declared_members(tiny_model_dir):
    backend = Watched(CountingBackend())
    config = EngineConfig(model=tiny_model_dir("llama2"), block_size=4, num_kv_blocks=16, max_num_seqs=3)
    engine = LLMEngine(config, backend=backend)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 8, 9, 10, 12], [40, 41]]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, n=2)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    for i, p in enumerate(prompts):
        expect = [(p[-1] + k) % engine.vocab_size for k in range(1, 21)]
        assert [o.token_ids for o in finals[f"r{i}"].outputs] == [expect, expect]
    assert engine.scheduler.num_preemptions > 0  # 16 blocks of 4 cannot hold three 27-token sequences
    assert engine.block_manager.num_free_blocks == 16
    engine.shutdown()
    assert backend.touched <= DECLARED | LAUNCHING


def test_an_object_missing_part_of_the_contract_is_refused(tiny_model_dir):
    partial = type("Partial", (), {k: v for k, v in vars(CountingBackend).items() if k != "shutdown"})
    with pytest.raises(TypeError, match="does not implement"):
        LLMEngine(EngineConfig(model=tiny_model_dir("llama2"), num_kv_blocks=8), backend=partial())
