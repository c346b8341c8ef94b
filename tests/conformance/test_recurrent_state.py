"""Models with recurrent layers (Qwen3-Next / Qwen3.5's linear attention, LFM2's short convolutions,
Granite 4.0-H's Mamba-2 mixers, Mamba's, Falcon-Mamba's and Jamba's Mamba-1 mixers) keep a state per sequence
beside the paged KV pool: batching, chunking, preemption and slot reuse must never leak one
sequence's state into another's. Checked on both backends against each sequence run alone and
against transformers."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM, SamplingParams
from tests.fixtures.failures import fail_once_after_forward
from tests.fixtures.teacher_forcing import teacher_forced_logits

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [
    "Continuous batching lets new requests join",
    "def add(a, b):",
    "Paged attention stores keys and values in blocks, while continuous batching lets new requests join",
    "Numbers 0123456789",
    "x",
]


def _alone(path: str, backend: str, prompts: list[str]) -> list[list[int]]:
    llm = LLM(path, backend=backend, dtype="float32", block_size=4, num_kv_blocks=128, max_num_seqs=1)
    return [llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in prompts]


@pytest.mark.parametrize(
    "variant",
    [
        "qwen3_next",
        "qwen3_5",
        "lfm2",
        "lfm2_moe",
        "granite_hybrid",
        "granite_hybrid_moe",
        "nemotron_h",
        "falcon_h1",
        "mamba",
        "falcon_mamba",
        "jamba",
        "mamba2",
        "zamba",
    ],
)
def test_batched_chunked_and_preempted_runs_equal_each_sequence_alone(tiny_model_dir, variant, backend, caplog):
    path = tiny_model_dir(variant)
    want = _alone(path, backend, PROMPTS)
    # Chunks of 5 tokens spread prompts over steps beside other sequences' decodes; 24 blocks of 4
    # tokens cannot hold all five sequences' 30-50 tokens, so some are preempted and recomputed.
    with caplog.at_level(logging.INFO):
        llm = LLM(path, backend=backend, dtype="float32", block_size=4, num_kv_blocks=24, prefill_chunk_size=5)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == want
    assert llm.engine.scheduler.num_preemptions > 0
    assert "the recurrent state is kept at block boundaries" in caplog.text  # preempted ones restart from snapshots
    # Every slot is back, and a second round reusing them (no zeroing in between) gives the same.
    assert sorted(llm.engine.scheduler.free_state_slots) == list(range(llm.engine.config.max_num_seqs))
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[::-1], GREEDY)] == want[::-1]


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_sampled_fan_out_matches_single_requests(tiny_model_dir, backend, prefix_cache):
    """n = 2, seeds as single requests: the second sample starts from the first's snapshot of the state at
    the prompt's last block boundary, or, without a prefix cache, computes the prompt itself."""
    path = tiny_model_dir("qwen3_next")
    opts = dict(dtype="float32", block_size=4, num_kv_blocks=128, enable_prefix_caching=prefix_cache)
    llm = LLM(path, backend=backend, **opts)
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=7, n=2, ignore_eos=True)
    out = llm.generate([PROMPTS[0]], params)[0]
    both = [c.token_ids for c in out.outputs]
    assert (llm.engine.scheduler.states is not None and llm.engine.scheduler.states.restores == 1) == prefix_cache
    single = [
        llm.generate([PROMPTS[0]], SamplingParams(temperature=1.0, max_tokens=16, seed=7 + i, ignore_eos=True))[0]
        .outputs[0]
        .token_ids
        for i in range(2)
    ]
    assert both == single and both[0] != both[1]


@pytest.mark.parametrize("variant", ["qwen3_5", "granite_hybrid", "nemotron_h", "mamba", "jamba", "zamba"])
@pytest.mark.parametrize("chunk", [100, 512])
def test_long_prompt_logits_match_transformers(tiny_model_dir, backend, chunk, variant):
    """A 150-token prompt: the scans' 64-token chunks inside a step (chunk 512) and prefill steps
    that end mid-chunk (100), then decodes; every position's logits equal transformers'."""
    from transformers import AutoModelForCausalLM

    path = tiny_model_dir(variant)
    llm = LLM(path, backend=backend, dtype="float32", block_size=16, prefill_chunk_size=chunk, num_kv_blocks=64)
    rng = np.random.default_rng(0)
    prompt = rng.integers(10, llm.engine.vocab_size, 150).tolist()
    forced = rng.integers(10, llm.engine.vocab_size, 6).tolist()
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = ref(torch.tensor([prompt + forced])).logits[0].numpy()
    rows = list(teacher_forced_logits(llm.engine, prompt, forced))
    assert [pos for pos, _ in rows] == list(range(149, 155))
    for pos, logits in rows:
        np.testing.assert_allclose(logits, expected[pos], atol=1e-4, rtol=0, err_msg=f"position {pos}")


@pytest.mark.parametrize("variant", ["qwen3_next", "lfm2", "granite_hybrid"])
def test_state_memory_is_sized_and_the_kv_pool_holds_attention_layers_only(tiny_model_dir, backend, variant, caplog):
    """What the sizing counts per sequence is what the backend allocates per slot (3 running sequences' slots
    and the prefix cache's 2 snapshots here)."""
    with caplog.at_level(logging.INFO):
        llm = LLM(
            tiny_model_dir(variant),
            backend=backend,
            dtype="float32",
            num_kv_blocks=16,
            max_num_seqs=3,
            prefix_cache_states=2,
        )
    assert llm.engine.model_config.num_kv_layers == 2 and len(llm.engine.backend.pool.k) == 2  # of 4 layers
    model = llm.engine.backend.model
    state = model.state if backend == "torch" else model.recurrent
    arrays = [*state.conv, *getattr(state, "ssm", [])]
    assert all(a.shape[0] == 5 for a in arrays)
    assert llm.engine.backend.state_bytes_per_seq() == sum(a.nbytes for a in arrays) // 5 > 0
    assert "recurrent state:" in caplog.text and "for 3 sequences" in caplog.text
    assert "for 2 prefix-cache snapshots" in caplog.text
    assert llm.engine.scheduler.states is not None and llm.engine.scheduler.states.first == 3


def test_a_step_failing_after_its_forward_pass_is_retried_from_position_0(tiny_model_dir, backend):
    """A batch fails after the forward pass wrote its recurrent states (as a sampler or a later layer's
    error would): the engine's one-by-one retry must not apply those tokens twice."""
    path = tiny_model_dir("qwen3_next")
    want = _alone(path, backend, PROMPTS[:3])
    llm = LLM(path, backend=backend, dtype="float32", block_size=4, num_kv_blocks=128, prefill_chunk_size=5)
    failed = fail_once_after_forward(llm.engine.backend)
    outs = llm.generate(PROMPTS[:3], GREEDY)
    assert failed, "the injected failure never ran"
    assert [o.outputs[0].token_ids for o in outs] == want
