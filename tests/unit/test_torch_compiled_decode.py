"""Decode steps through torch.compile (`--compile`, backends/torch/compiled_decode.py) on a CPU.

The compiled layers are checked against transformers' forward pass (the logits, teacher-forced,
through the paged cache), against the eager path (greedy tokens of a batch of rows of different
lengths, and int4 weights), and through the real server with the official openai SDK. Models the
graph cannot hold (a mixture of experts) and backends it does not apply to are said so.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from lantern.app.cli import main
from lantern.app.engine import LLM, SamplingParams
from lantern.backends.torch import cpu_attention
from lantern.backends.torch.compiled_decode import CompiledDecode, group_size
from tests.conformance.test_parity import PROMPT, hf_model
from tests.fixtures.teacher_forcing import teacher_forced_logits
from tests.fixtures.tiny_models import build_model
from tests.server.conftest import start_server

SMALL = dict(backend="torch", dtype="float32", block_size=4, prefill_chunk_size=8, num_kv_blocks=64)


def _compiled_steps(llm: LLM) -> int:
    compiled = llm.engine.backend.model.compiled_decode
    assert compiled is not None and compiled.failed is None
    return compiled.steps


@pytest.mark.parametrize("variant", ["llama3", "qwen3", "gemma2"])  # GQA + llama3 rope; q/k norms; softcap + windows
def test_logits_match_transformers(tiny_model_dir, variant):
    path = tiny_model_dir(variant)
    llm = LLM(path, compile_decode=True, **SMALL)
    try:
        ids = llm.tokenizer.encode(PROMPT)
        hf = hf_model(path)
        hf.generation_config.eos_token_id = None
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=0)
            forced = out[0, len(ids) :].tolist()
            ref = hf(torch.tensor([ids + forced])).logits[0].numpy()
        before = _compiled_steps(llm)
        rows = list(teacher_forced_logits(llm.engine, ids, forced))
        assert len(rows) == 6
        worst = max(float(np.abs(ours - ref[pos]).max() / ref[pos].std()) for pos, ours in rows)
        assert worst < 1e-4, worst
        assert _compiled_steps(llm) - before == 5  # every decode step ran through the graph
    finally:
        llm.engine.shutdown()


def test_layers_in_groups_match_transformers(tmp_path):
    """Five layers in compiled calls of two (the last group a shorter graph of its own): each
    layer reads its own weights and KV, in order; the logits are transformers'."""
    path = str(build_model("llama3", tmp_path / "five", num_hidden_layers=5))
    llm = LLM(path, **SMALL)
    try:
        model = llm.engine.backend.model
        model.compiled_decode = CompiledDecode(model.model.layers, [None] * 5, group=2)
        assert [list(g) for g in model.compiled_decode.groups] == [[0, 1], [2, 3], [4]]
        ids = llm.tokenizer.encode(PROMPT)
        hf = hf_model(path)
        with torch.no_grad():
            forced = [7, 3, 11, 5, 2]
            ref = hf(torch.tensor([ids + forced])).logits[0].numpy()
        rows = list(teacher_forced_logits(llm.engine, ids, forced))
        worst = max(float(np.abs(ours - ref[pos]).max() / ref[pos].std()) for pos, ours in rows)
        assert worst < 1e-4, worst
        assert model.compiled_decode.steps == 4 and model.compiled_decode.failed is None
    finally:
        llm.engine.shutdown()


def test_group_size_divides_the_depth_where_it_can():
    assert [group_size(n) for n in (30, 24, 16, 28, 40, 32, 2)] == [6, 6, 4, 7, 5, 4, 6]
    assert group_size(23) == 6  # no divisor near 6: a shorter last group


def _greedy(llm: LLM, prompts: list[list[int]], n: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _eager_greedy(path: str, prompts: list[list[int]], n: int) -> list[list[int]]:
    eager = LLM(path, **SMALL)
    try:
        return _greedy(eager, prompts, n)
    finally:
        eager.engine.shutdown()


def test_batches_of_rows_decode_as_eager(tiny_model_dir):
    """Rows of different lengths together, then one row alone: the same greedy tokens."""
    path = tiny_model_dir("llama3")
    prompts = [list(range(5, 5 + n)) for n in (3, 11, 26)]
    eager = LLM(path, **SMALL)
    want_batch, want_one = _greedy(eager, prompts, 16), _greedy(eager, prompts[1:2], 24)
    eager.engine.shutdown()
    llm = LLM(path, compile_decode=True, **SMALL)
    try:
        before = _compiled_steps(llm)
        assert _greedy(llm, prompts, 16) == want_batch
        assert _greedy(llm, prompts[1:2], 24) == want_one
        assert _compiled_steps(llm) - before >= 15 + 23
        # The lone row's 23 steps: each span (block size 4) first passes the full guards, the others
        # ran with only the differentiating ones, and the tokens above are still eager's. Batched
        # steps always check every guard.
        assert llm.engine.backend.model.compiled_decode.guard_free_steps >= 23 - 8
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("native", [False, True], ids=["gathered", "native-attention"])
def test_guard_free_steps_need_a_signature_that_passed_the_guards(tiny_model_dir, monkeypatch, native):
    """A new span or batch size checks every guard first; a second compiled engine resets dynamo's
    cache (the first one's graphs are gone), so the first one stops skipping guards, still right.
    The signatures the warm-up ran get graphs without any guard; a signature first seen later never
    runs through them.
    With the native attention (cpu_attention) the graph reads the block tables, whose width is
    symbolic: one signature serves every context of two blocks or more."""
    if native and not cpu_attention.serves(torch.float32, torch.device("cpu")):
        pytest.skip("the native attention is built for x86-64 CPUs with AVX-512 only")
    monkeypatch.setattr(cpu_attention, "serves", lambda dtype, device: native)
    path = tiny_model_dir("llama3")
    prompt = [list(range(5, 18))]
    want = _eager_greedy(path, prompt, 12)
    first = LLM(path, compile_decode=True, **SMALL)
    try:
        compiled = first.engine.backend.model.compiled_decode
        assert _greedy(first, prompt, 12) == want
        if native:
            # The warm-up's one-row steps after its first (one signature: the graph without guards
            # was made for it) and all 11 decode steps, through that graph.
            assert compiled.guard_free_steps == 3 + 11, compiled.guard_free_steps
            assert compiled.unguarded_steps == 3 + 11, compiled.unguarded_steps
        else:
            # The warm-up's second pass over its two one-row signatures (through graphs without
            # guards), then 11 decode steps over contexts of 14..24 tokens: spans of 4, 5 and 6
            # blocks (block size 4), each first seen with every guard checked, and then run with
            # only the differentiating guards: no graph without guards is made after the warm-up.
            assert compiled.guard_free_steps == 2 + 11 - 3, compiled.guard_free_steps
            assert compiled.unguarded_steps == 2, compiled.unguarded_steps
        done = compiled.guard_free_steps
        assert _greedy(first, prompt, 12) == want
        # Mostly known signatures now (the blocks may lie elsewhere in the pool: a new one is checked)
        assert compiled.guard_free_steps >= done + 8, compiled.guard_free_steps
        done, unguarded = compiled.guard_free_steps, compiled.unguarded_steps
        # A context of one block (a signature of its own, first seen now): not through a graph made
        # for another signature, and still eager's tokens.
        assert _greedy(first, [[5]], 3) == _eager_greedy(path, [[5]], 3)  # contexts of 2 and 3 tokens
        assert compiled.unguarded_steps == unguarded
        done = compiled.guard_free_steps
        second = LLM(path, compile_decode=True, **SMALL)
        second.engine.shutdown()
        assert _greedy(first, prompt, 12) == want
        assert compiled.guard_free_steps == done
    finally:
        first.engine.shutdown()


def test_a_bf16_pool_decodes_through_the_native_attention(tiny_model_dir):
    """bf16, the default dtype on CPUs with native bf16: the graph calls the native attention on the
    bf16 pool for every decode step, one signature serves the growing context (guard-free after its
    first step), and the logits are eager's up to bf16 rounding. Not eager's greedy tokens: inductor
    computes the fused ops around the kernels in float32 where eager rounds after each, and this
    random tiny model has near-ties (two logits one bf16 value apart) that such roundings decide."""
    if not cpu_attention.serves(torch.bfloat16, torch.device("cpu")):
        pytest.skip("the native attention is built for x86-64 CPUs with AVX-512 only")
    path = tiny_model_dir("llama3")
    bf16 = dict(SMALL, dtype="bfloat16")
    prompt, forced = list(range(5, 18)), [136, 396, 87, 212, 354, 246, 130, 214]
    eager = LLM(path, **bf16)
    try:
        want = dict(teacher_forced_logits(eager.engine, prompt, forced))
    finally:
        eager.engine.shutdown()
    llm = LLM(path, compile_decode=True, **bf16)
    try:
        assert llm.engine.backend.pool.native_decode and llm.engine.backend.pool.k[0].dtype == torch.bfloat16
        compiled = llm.engine.backend.model.compiled_decode
        before, free = _compiled_steps(llm), compiled.guard_free_steps
        # The compiled code calls the op through the dispatcher, which the profiler records.
        with torch.profiler.profile() as prof:
            got = dict(teacher_forced_logits(llm.engine, prompt, forced))
        calls = [e for e in prof.events() if e.name == "lantern::paged_decode"]
        steps = len(forced) - 1
        assert _compiled_steps(llm) - before == steps and compiled.guard_free_steps - free >= steps - 1
        assert len(calls) == steps * len(llm.engine.backend.model.model.layers)
    finally:
        llm.engine.shutdown()
    worst = max(float(np.abs(got[p] - want[p]).max() / want[p].std()) for p in want)
    assert worst < 0.12, worst  # ~0.065 measured; a wrong attention output is ~1


@pytest.mark.parametrize("source", ["isq", "gptq_act"])
def test_int4_weights_decode_as_eager(tiny_model_dir, tmp_path, source):
    """--isq q4, and a GPTQ act-order folder (each layer gathers x's columns first): the int4 matmuls
    inside the graph (inductor calls its own int4 op) give the eager logits, up to the bf16 rounding
    of their inputs that both paths share."""
    from tests.fixtures.hf_quant_writers import writer

    path = tiny_model_dir("llama3") if source == "isq" else str(writer(source, tmp_path)[0])
    quantization = "q4" if source == "isq" else None
    ids = list(range(7, 40))
    forced = [11, 12, 13, 14, 15, 16]
    rows = {}
    for compiled in (False, True):
        llm = LLM(path, quantization=quantization, compile_decode=compiled, **SMALL)
        try:
            rows[compiled] = dict(teacher_forced_logits(llm.engine, ids, forced))
            if compiled:
                assert _compiled_steps(llm) >= 5
        finally:
            llm.engine.shutdown()
    for pos, eager in rows[False].items():
        assert np.abs(rows[True][pos] - eager).max() / eager.std() < 2e-2, pos


def test_a_graph_that_fails_to_compile_falls_back_to_eager(tiny_model_dir, caplog):
    """A compile failure on any layer (here a test double in place of the compiled function, failing
    at the second layer) turns the path off with a warning; the step reruns eagerly, the same tokens."""
    path = tiny_model_dir("llama3")
    prompt = [list(range(5, 18))]
    want = _eager_greedy(path, prompt, 10)
    llm = LLM(path, compile_decode=True, **SMALL)
    try:
        model = llm.engine.backend.model
        compiled = model.compiled_decode = CompiledDecode(model.model.layers, [None, None], group=1)
        real, calls = compiled.fn, []

        def second_layer_fails(layers, *args):
            calls.append(layers)
            if len(calls) == 2:
                raise RuntimeError("inductor could not lower this")
            return real(layers, *args)

        compiled.fn = second_layer_fails
        with caplog.at_level(logging.WARNING, logger="lantern.backends.torch.compiled_decode"):
            assert _greedy(llm, prompt, 10) == want
        assert compiled.failed == "RuntimeError: inductor could not lower this" and len(calls) == 2
        assert any("compiled decode is off" in r.getMessage() for r in caplog.records)
    finally:
        llm.engine.shutdown()


def test_mixture_of_experts_decodes_eagerly_and_says_so(tiny_model_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="lantern.backends.torch.runner"):
        llm = LLM(tiny_model_dir("mixtral"), compile_decode=True, **SMALL)
    try:
        assert llm.engine.backend.model.compiled_decode is None
        assert any("--compile: not for this architecture" in r.getMessage() for r in caplog.records)
        assert len(_greedy(llm, [list(range(5, 15))], 4)[0]) == 4
    finally:
        llm.engine.shutdown()


def test_mlx_refuses_compile(tiny_model_dir):
    with pytest.raises(ValueError, match="--compile applies to the torch backend"):
        LLM(tiny_model_dir("llama2"), backend="mlx", compile_decode=True)


def test_cli_refuses_compile_on_mlx_in_one_line(tiny_model_dir, caplog):
    assert main(["serve", "--w", tiny_model_dir("llama2"), "--backend", "mlx", "--compile"]) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "--compile" in errors[0], errors


def test_server_streams_the_eager_answers(tiny_model_dir):
    """`lantern serve --compile` on torch: three concurrent streamed chats (the engine thread runs
    the graph for one and for several rows) give the eager server's greedy answers."""
    from openai import OpenAI

    path = tiny_model_dir("llama2")
    questions = ["Name a colour.", "Count to five, please.", "What does a paged KV cache store?"]

    def answers(**opts) -> list[str]:
        srv = start_server(path, backend="torch", **opts)
        compiled = srv.engine._engine.backend.model.compiled_decode
        before = compiled.steps if compiled is not None else None
        try:
            client = OpenAI(base_url=srv.base_url + "/v1", api_key="x")

            def ask(q: str) -> str:
                stream = client.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": q}],
                    max_tokens=12,
                    temperature=0,
                    stream=True,
                )
                return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

            with ThreadPoolExecutor(3) as pool:
                got = list(pool.map(ask, questions))
            if compiled is not None:
                assert compiled.steps - before >= 11  # the decode steps ran through the graph
            return got
        finally:
            srv.stop()

    want = answers()
    assert all(want)
    assert answers(compile_decode=True) == want
