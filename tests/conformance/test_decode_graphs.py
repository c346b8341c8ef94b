"""Decode steps through the CUDA-graph path give the same tokens as eager steps.

On a CPU the static-buffer path runs without capture (`static_decode=True`): batches are padded to
their bucket (1, 2, 4, 8, 16, ...) with rows that must neither write the KV pool nor disturb the
real rows. The gpu-marked cases capture and replay real CUDA graphs, in float32 and bfloat16.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from lantern.app.config import EngineConfig  # noqa: E402
from lantern.app.engine import LLM, SamplingParams  # noqa: E402
from lantern.app.engine.contract import BackendOptions  # noqa: E402
from lantern.app.engine.engine import LLMEngine  # noqa: E402
from lantern.backends.torch.runner import TorchBackend  # noqa: E402
from tests.conformance.test_scheduling import make_prompts  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def engine_with(path, backend, dtype="float32"):
    llm = LLM.__new__(LLM)
    llm.engine = LLMEngine(EngineConfig(model=path, dtype=dtype, block_size=4, num_kv_blocks=256), backend=backend)
    llm.tokenizer = llm.engine.tokenizer
    return llm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", ["llama2", "qwen3"])
def test_padded_decode_matches_eager(tiny_model_dir, device, variant, monkeypatch):
    """(qwen3: the block tables go over a step's columns at a time, as for long contexts at large batches;
    llama2: as whole rows with the lengths, in one copy)"""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if variant == "qwen3":
        from lantern.backends.torch import cuda_graphs

        monkeypatch.setattr(cuda_graphs, "_WHOLE_TABLE_ROWS", 0)
    path = tiny_model_dir(variant)
    eager = engine_with(path, TorchBackend(device=device, options=BackendOptions(enforce_eager=True)))
    graphed = engine_with(path, TorchBackend(device=device, static_decode=True))
    assert eager.engine.backend.graphs is None and graphed.engine.backend.graphs is not None
    graphs = graphed.engine.backend.graphs
    assert graphs.buckets[-1] >= graphed.engine.config.max_num_seqs  # every batch the scheduler may form
    if device == "cuda":  # captured at start-up, before the first request
        assert set(graphs.graphs) == set(graphs.buckets)
    replays = []
    run = graphed.engine.backend.graphs.run
    graphed.engine.backend.graphs.run = lambda batch, *rest: replays.append(batch.num_seqs) or run(batch, *rest)
    # 3, 5 and 11 requests pad to buckets 4, 8 and 16; prompts of mixed lengths finish prefill at
    # different steps, so decode batches also change size while requests run.
    for count in (3, 5, 11):
        prompts = make_prompts(eager.tokenizer, count, seed=count, min_len=3, max_len=14)
        want = [o.outputs[0].token_ids for o in eager.generate(prompts, GREEDY)]
        got = [o.outputs[0].token_ids for o in graphed.generate(prompts, GREEDY)]
        assert got == want
    assert {3, 5, 11} <= set(replays)  # the padded path really ran at those sizes
    bm = graphed.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


@pytest.mark.gpu
def test_bfloat16_graphs_follow_float32_on_cuda(tiny_model_dir):
    """bf16 on the GPU (the default dtype there) stays close to float32: most greedy tokens agree."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    path = tiny_model_dir("llama3")
    f32 = engine_with(path, TorchBackend(device="cuda"), dtype="float32")
    bf16 = engine_with(path, TorchBackend(device="cuda"), dtype="bfloat16")
    prompts = make_prompts(f32.tokenizer, 8, seed=1)
    a = [o.outputs[0].token_ids for o in f32.generate(prompts, GREEDY)]
    b = [o.outputs[0].token_ids for o in bf16.generate(prompts, GREEDY)]
    first_agree = sum(x[:4] == y[:4] for x, y in zip(a, b))
    assert first_agree >= 6, (a, b)


def test_carried_ids_are_taken_on_the_device_row_by_row():
    """Steps scheduled ahead: ids[i] = tokens[carried[i]] where carried[i] >= 0, the host's id elsewhere."""
    from lantern.backends.torch.cuda_graphs import take_carried

    ids = torch.tensor([5, 6, 7, 8])
    take_carried(ids, torch.tensor([2, -1, 0, 2]), torch.tensor([40, 41, 42], dtype=torch.int64))
    assert ids.tolist() == [42, 6, 40, 42]


def test_consecutive_decode_steps_are_staged_in_alternate_host_buffers(tiny_model_dir):
    """With steps scheduled ahead, step N+1's inputs are staged on the host while step N's copies may still be
    queued (pinned memory, asynchronous on CUDA): the runner fills its two host buffers in turn."""
    llm = engine_with(tiny_model_dir("llama2"), TorchBackend(static_decode=True))
    prompt = [5, 6, 7, 8, 9]
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    graphs = llm.engine.backend.graphs
    # The last two decode steps, at positions 13 and 12 (5 prompt tokens, the 10th token drawn at position 13).
    assert sorted(int(h[1, 0]) for h in graphs.h_long) == [len(prompt) + 7, len(prompt) + 8]
