"""Constrained decoding on each backend: the token mask in the sampler (greedy and random rows,
alongside filters and bans), and end to end through the engine: grammars honoured, EOS only where
the grammar accepts, unconstrained rows untouched by constrained neighbours, preemption, n > 1."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from lantern.app.engine import LLM, InvalidRequestError, SamplingParams, StructuredSpec
from lantern.app.engine.contract import SamplingRow
from lantern.app.engine.structured import pack_allowed, unpack_mask
from tests.conformance.test_sampler_draws import Sampler
from tests.conformance.test_scheduling import all_blocks_free, make_prompts

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}
JSON = StructuredSpec("json_schema", PERSON)


@pytest.fixture(scope="module")
def sampler(backend) -> Sampler:
    return Sampler(backend)


@pytest.fixture(scope="module")
def llm(tiny_model_dir, backend) -> LLM:
    return LLM(tiny_model_dir("llama2"), backend=backend, dtype="float32", block_size=4, num_kv_blocks=512)


def masked_row(seed: int, allowed: list[int] | None, vocab: int, step: int = 0, **kw) -> SamplingRow:
    r = SamplingRow(params=SamplingParams(max_tokens=None, **kw), seed=seed, step=step)
    if allowed is not None:
        r.token_bitmask = pack_allowed(allowed, vocab)
    return r


# ---- the sampler ---------------------------------------------------------------------------------
def test_pack_and_unpack_agree_with_the_bit_layout():
    vocab = 77
    mask = pack_allowed([0, 31, 32, 76], vocab)
    assert mask.dtype == np.int32 and mask.shape == (3,)
    assert mask[0] == np.int32(np.uint32(1 | 1 << 31).view(np.int32)) and mask[1] == 1
    assert np.nonzero(unpack_mask(mask, vocab))[0].tolist() == [0, 31, 32, 76]


@pytest.mark.parametrize(
    "kw", [{"temperature": 0}, {"temperature": 1.3}, {"temperature": 0.8, "top_k": 5, "top_p": 0.9}]
)
def test_masked_rows_draw_only_allowed_tokens_and_others_draw_as_alone(sampler, kw):
    rng = np.random.default_rng(7)
    vocab = 1000
    logits = (rng.standard_normal((4, vocab)) * 3).astype(np.float32)
    for step in range(30):
        allowed = [sorted(rng.choice(vocab, size=int(rng.integers(1, 40)), replace=False).tolist()) for _ in range(2)]
        rows = [
            masked_row(1, allowed[0], vocab, step, **kw),
            masked_row(2, None, vocab, step, **kw),
            masked_row(3, allowed[1], vocab, step, **kw),
            masked_row(4, None, vocab, step, temperature=0),
        ]
        tokens = sampler.sample(logits, rows)
        assert tokens[0] in allowed[0] and tokens[2] in allowed[1]
        # The same draw as an unconstrained row over logits with the forbidden columns at -inf.
        for i, a in ((0, allowed[0]), (2, allowed[1])):
            pre = np.full(vocab, -np.inf, np.float32)
            pre[a] = logits[i, a]
            assert tokens[i] == sampler.sample(pre[None, :], [masked_row(i + 1, None, vocab, step, **kw)])[0]
        assert tokens[1] == sampler.sample(logits[1:2], rows[1:2])[0]
        assert tokens[3] == int(np.argmax(logits[3]))


def test_mask_narrower_than_the_logits_forbids_the_rest(sampler):
    vocab = 130  # logits padded past the tokenizer: a 2-word (64-token) mask covers 0..63 only
    logits = np.zeros((1, vocab), np.float32)
    logits[0, 100:] = 50.0  # the best columns lie past the mask
    row = SamplingRow(params=SamplingParams(temperature=0), seed=0, step=0)
    row.token_bitmask = pack_allowed([3, 40], 64)
    logits[0, 40] = 1.0
    assert sampler.sample(logits, [row]) == [40]


def test_mask_and_bans_combine(sampler):
    vocab = 64
    logits = np.arange(vocab, dtype=np.float32)[None, :]
    row = SamplingRow(params=SamplingParams(temperature=0), seed=0, step=0, banned_token_ids=[50])
    row.token_bitmask = pack_allowed([10, 50], vocab)
    assert sampler.sample(logits, [row]) == [10]


# ---- the engine ----------------------------------------------------------------------------------
def test_json_schema_is_followed_and_terminates(llm):
    for temp in (0.0, 1.0):
        p = SamplingParams(temperature=temp, seed=3, max_tokens=200, n=3, structured=JSON)
        for o in llm.generate(["Hello", "The list"], p):
            for c in o.outputs:
                assert c.finish_reason == "stop", c.text
                jsonschema.validate(json.loads(c.text), PERSON)


def test_regex_choice_and_grammars_are_honoured(llm):
    cases = [
        (StructuredSpec("regex", r"[a-c]{4,6}-[0-9]{2}"), lambda t: re.fullmatch(r"[a-c]{4,6}-[0-9]{2}", t)),
        (StructuredSpec("choice", ["yes", "no", "peut-être"]), lambda t: t in ("yes", "no", "peut-être")),
        (StructuredSpec("lark", 'start: "x" NUM "y"\nNUM: /[0-9]{1,3}/'), lambda t: re.fullmatch(r"x[0-9]{1,3}y", t)),
        (StructuredSpec("gbnf", 'root ::= "(" [a-z]{2} ")"'), lambda t: re.fullmatch(r"\([a-z]{2}\)", t)),
    ]
    for spec, ok in cases:
        p = SamplingParams(temperature=1.0, seed=11, max_tokens=60, n=4, structured=spec)
        for c in llm.generate("Once upon", p)[0].outputs:
            assert ok(c.text) and c.finish_reason == "stop", (spec.kind, c.text)


def test_eos_only_where_the_grammar_accepts(llm):
    # A bias makes EOS the favourite everywhere: unconstrained samples end at once, constrained ones
    # only once the grammar accepts (5 letters), and then at once.
    eos = llm.engine.eos_token_ids
    bias = {t: 12.0 for t in eos}
    plain = SamplingParams(temperature=1.0, seed=0, max_tokens=60, n=8, logit_bias=bias)
    assert all(len(c.token_ids) == 1 and c.token_ids[0] in eos for c in llm.generate("Hi", plain)[0].outputs)
    spec = StructuredSpec("regex", r"[a-z]{5,40}")
    p = SamplingParams(temperature=1.0, seed=0, max_tokens=60, n=8, structured=spec, logit_bias=bias)
    for c in llm.generate("Hi", p)[0].outputs:
        assert re.fullmatch(r"[a-z]{5,40}", c.text) and c.finish_reason == "stop"
        assert c.token_ids[-1] in eos and len(llm.tokenizer.decode(c.token_ids[:-2])) < 5


def test_max_tokens_and_stop_strings_still_apply(llm):
    p = SamplingParams(temperature=0, max_tokens=3, structured=JSON)
    out = llm.generate("Hello", p)[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3 and out.text.startswith("{")
    p = SamplingParams(temperature=0, max_tokens=100, structured=JSON, stop=['"age"'])
    out = llm.generate("Hello", p)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == '"age"' and '"age"' not in out.text


def test_unconstrained_rows_are_untouched_by_constrained_neighbours(llm):
    prompts = make_prompts(llm.tokenizer, 4, seed=4)
    free = [SamplingParams(temperature=0, max_tokens=20), SamplingParams(temperature=1.0, seed=9, max_tokens=20)]
    alone = [[o.outputs[0].token_ids for o in llm.generate(prompts, p)] for p in free]
    bound = SamplingParams(temperature=1.0, seed=5, max_tokens=200, structured=JSON)
    bound_alone = [o.outputs[0].token_ids for o in llm.generate(prompts, bound)]
    mixed = llm.generate(prompts * 3, [free[0]] * 4 + [bound] * 4 + [free[1]] * 4)
    tokens = [o.outputs[0].token_ids for o in mixed]
    assert tokens[:4] == alone[0] and tokens[8:] == alone[1]
    assert tokens[4:8] == bound_alone


def test_preemption_keeps_matchers_consistent(tiny_model_dir, backend):
    # Each sequence needs ~ (25 + ~40) / 4 blocks; 36 blocks hold about two of them.
    llm = LLM(tiny_model_dir("llama2"), backend=backend, dtype="float32", block_size=4, num_kv_blocks=36)
    prompts = make_prompts(llm.tokenizer, 5, seed=1, min_len=20, max_len=30)
    p = SamplingParams(temperature=1.0, seed=2, max_tokens=120, structured=JSON)
    together = llm.generate(prompts, p)
    assert llm.engine.scheduler.num_preemptions > 0
    for o in together:
        jsonschema.validate(json.loads(o.outputs[0].text), PERSON)
    assert [o.outputs[0].token_ids for o in together] == [llm.generate([q], p)[0].outputs[0].token_ids for q in prompts]
    assert all_blocks_free(llm.engine)


def test_allowed_token_ids_alone_and_with_a_grammar(llm):
    allowed = llm.tokenizer.encode("abc 123", add_special_tokens=False)
    p = SamplingParams(temperature=1.0, seed=1, max_tokens=30, allowed_token_ids=allowed, n=3)
    for c in llm.generate("Hello", p)[0].outputs:
        assert set(c.token_ids) <= set(allowed) and len(c.token_ids) == 30
    digits = [t for t in range(len(llm.tokenizer)) if llm.tokenizer.decode([t]).strip().isdigit()]
    spec = StructuredSpec("regex", r"[0-9a-z]{3,8}")
    p = SamplingParams(temperature=1.0, seed=1, max_tokens=30, allowed_token_ids=digits, structured=spec, n=3)
    for c in llm.generate("Hello", p)[0].outputs:
        assert set(c.token_ids) <= set(digits) and re.fullmatch(r"[0-9]{3,8}", c.text)


def test_logprobs_are_reported_under_a_grammar(llm):
    p = SamplingParams(temperature=0, max_tokens=100, structured=JSON, logprobs=2)
    out = llm.generate("Hello", p)[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids) and all(np.isfinite(lp.logprob) for lp in out.logprobs)


@pytest.mark.parametrize(
    ("spec", "param"),
    [
        (StructuredSpec("json_schema", {"type": "nonsense"}, param="response_format"), "response_format"),
        (StructuredSpec("regex", "a(b", param="guided_regex"), "guided_regex"),
        (StructuredSpec("lark", "start: undefined_rule", param="guided_grammar"), "guided_grammar"),
        (StructuredSpec("gbnf", "root ::= (", param="structured_outputs.grammar"), "structured_outputs.grammar"),
    ],
)
def test_invalid_constraints_name_their_field(llm, spec, param):
    with pytest.raises(InvalidRequestError) as err:
        llm.generate("Hello", SamplingParams(structured=spec))
    assert err.value.param == param
    assert not llm.engine.has_unfinished_requests()


def test_allowed_token_ids_out_of_the_vocabulary_are_refused(llm):
    with pytest.raises(InvalidRequestError) as err:
        llm.generate("Hello", SamplingParams(allowed_token_ids=[1, llm.engine.vocab_size]))
    assert err.value.param == "allowed_token_ids"
