"""Rerankers beyond the XxxForSequenceClassification folders (test_cross_encoders.py), on both backends: Qwen3-Reranker
as released (a causal LM scored by P("yes") against P("no") after its prompt), told apart from a plain Qwen3 by its
name or README; and reranker GGUF files as llama.cpp's converter writes them (RANK pooling): bge-reranker's
XLM-RoBERTa with its `cls` / `cls.output` head, f32 and Q8_0, and Qwen3-Reranker with its yes / no rows and rerank
template. Each against transformers on the values the file holds."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from lantern.app.engine import LLM
from lantern.app.engine.scoring import tokenize_pair
from lantern.app.models.loader import resolve_model
from lantern.app.models.pooling import resolve_task
from lantern.app.models.qwen3_reranker import TEMPLATE
from lantern.app.models.spec import UnsupportedModelError
from tests.fixtures.gguf_encoders import convert_encoder_to_gguf
from tests.fixtures.gguf_families import convert_to_gguf
from tests.fixtures.tiny_models import build_model
from tests.fixtures.tiny_rerankers import build_cross_encoder, build_qwen3_reranker

QUERY = "what does paged attention keep"
DOCS = [
    "Paged attention keeps every sequence in fixed blocks so memory is never fragmented.",
    "The quick brown fox jumps over the lazy dog.",
    "a",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt-rerankers")
    return {
        "untied": str(build_qwen3_reranker(root / "Qwen3-Reranker-tiny", seed=1)),
        "tied": str(build_qwen3_reranker(root / "qwen3-reranker-tied", seed=2, tie=True)),
    }


def engine(model: str, backend: str, **options) -> LLM:
    return LLM(model=model, backend=backend, dtype="float32", block_size=4, **options)


def yes_probability(folder: str, prompts: list[list[int]]) -> list[float]:
    """transformers' causal LM: softmax over the "yes" and "no" logits at the last position, as the model card."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    out = []
    for ids in prompts:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        out.append(float(torch.softmax(torch.stack([logits[yes], logits[no]]), 0)[0]))
    return out


def prompt_ids(folder: str, query: str, document: str) -> list[int]:
    text = TEMPLATE.replace("{query}", query).replace("{document}", document)
    return AutoTokenizer.from_pretrained(folder)(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("name", ["untied", "tied"])
def test_qwen3_reranker_matches_transformers(folders, backend, name):
    llm = engine(folders[name], backend)
    assert llm.engine.task == "score"
    outs = llm.score(QUERY, DOCS)
    prompts = [prompt_ids(folders[name], QUERY, d) for d in DOCS]
    assert [o.num_prompt_tokens for o in outs] == [len(p) for p in prompts]
    np.testing.assert_allclose([o.score for o in outs], yes_probability(folders[name], prompts), atol=2e-5, rtol=0)


def test_long_documents_keep_the_prompt_whole(folders, backend):
    """A document past the context is cut at one of its token boundaries: the prompt's head and tail stay, the
    input fits, and its score is transformers' on those very ids."""
    limit = len(prompt_ids(folders["untied"], QUERY, "")) + 24
    llm = engine(folders["untied"], backend, max_model_len=limit)
    long_doc = DOCS[0] * 6
    ids, types = tokenize_pair(llm.engine, QUERY, long_doc)
    tok = llm.engine.tokenizer
    text = tok.decode(ids)
    head, tail = TEMPLATE.split("{document}")
    assert types is None and limit - 6 <= len(ids) <= limit
    assert text.startswith(head.replace("{query}", QUERY)) and text.endswith(tail)
    out = llm.score(QUERY, long_doc)[0]
    assert out.num_prompt_tokens == len(ids)
    assert abs(out.score - yes_probability(folders["untied"], [ids])[0]) < 2e-5


def test_a_plain_qwen3_generates_unless_asked(folders, tmp_path):
    plain = tmp_path / "plain-qwen3"
    shutil.copytree(folders["untied"], plain)
    assert resolve_task("auto", "auto", resolve_model(str(plain)).spec)[0] == "generate"
    (plain / "README.md").write_text("---\nlicense: apache-2.0\n---\n# Qwen3-Reranker-0.6B\n\nA reranker.\n")
    assert resolve_task("auto", "auto", resolve_model(str(plain)).spec) == ("score", "last")
    (plain / "README.md").unlink()
    asked = engine(str(plain), "torch", task="score")  # --task score: the Qwen3-Reranker format
    assert (
        abs(asked.score(QUERY, DOCS[0])[0].score - engine(folders["untied"], "torch").score(QUERY, DOCS[0])[0].score)
        < 1e-6
    )
    llama = build_model("llama2", tmp_path / "llama")
    with pytest.raises(UnsupportedModelError, match="needs a cross-encoder"):
        engine(str(llama), "torch", task="score")


# ---- GGUF rerankers ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ggufs(tmp_path_factory, folders):
    root = tmp_path_factory.mktemp("gguf-rerankers")
    xlmr = build_cross_encoder(root / "xlmr", "xlm-roberta", seed=4, max_position_embeddings=258)
    out = {f"xlmr-{t}": convert_encoder_to_gguf(xlmr, root / f"xlmr-{t}", t) for t in ("f32", "q8_0")}
    out["xlmr-src"] = (xlmr, xlmr)
    tok = AutoTokenizer.from_pretrained(folders["tied"])
    rows = (tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no"))
    out["qwen3"] = convert_to_gguf(
        Path(folders["tied"]), root / "qwen3", "f32", rerank={"rows": rows, "template": TEMPLATE}
    )
    bert = build_cross_encoder(root / "bert", "bert", seed=5)
    out["bert"] = convert_encoder_to_gguf(bert, root / "bert-gguf", "f32")
    return out


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_xlmr_reranker_gguf(ggufs, backend, outtype):
    """bge-reranker as a `bert` GGUF: the pair tokenized as XLM-R's tokenizer does, the head's tanh dense and
    out_proj from cls / cls.output, equal to transformers' XLMRobertaForSequenceClassification on the file's values."""
    path, ref = ggufs[f"xlmr-{outtype}"]
    src = ggufs["xlmr-src"][0]
    llm = engine(str(path), backend)
    assert llm.engine.task == "score"
    hf_tok = AutoTokenizer.from_pretrained(src)
    for doc in DOCS:
        assert tokenize_pair(llm.engine, QUERY, doc) == (hf_tok(QUERY, doc)["input_ids"], None)
    model = AutoModelForSequenceClassification.from_pretrained(ref, dtype=torch.float32).eval()
    with torch.no_grad():
        want = [torch.sigmoid(model(**hf_tok(QUERY, d, return_tensors="pt")).logits[0, 0]).item() for d in DOCS]
    tolerance = 2e-5 if outtype == "f32" else 1e-4  # (Q8_0 matmuls on int8 activations in torch)
    np.testing.assert_allclose([o.score for o in llm.score(QUERY, DOCS)], want, atol=tolerance, rtol=0)


def test_qwen3_reranker_gguf(ggufs, folders, backend):
    """Qwen3-Reranker as llama.cpp writes it: the file's rerank template, the yes / no rows as cls.output."""
    path, ref = ggufs["qwen3"]
    llm = engine(str(path), backend)
    assert llm.engine.task == "score"
    prompts = [prompt_ids(folders["tied"], QUERY, d) for d in DOCS]
    np.testing.assert_allclose([o.score for o in llm.score(QUERY, DOCS)], yes_probability(ref, prompts), atol=2e-5)


def test_reranker_gguf_refusals(ggufs):
    with pytest.raises(UnsupportedModelError, match=r"pooler, which llama\.cpp's converter drops"):
        engine(str(ggufs["bert"][0]), "torch")
    with pytest.raises(ValueError, match=r"reranker \(pooling_type rank\)"):
        engine(str(ggufs["xlmr-f32"][0]), "torch", task="embed")


def test_score_on_a_gguf_that_is_no_reranker(folders, tmp_path):
    """The same Qwen3 written as a plain causal-LM GGUF (no RANK pooling): --task score is refused naming why."""
    path, _ = convert_to_gguf(Path(folders["tied"]), tmp_path / "gguf", "f32")
    with pytest.raises(UnsupportedModelError, match=r"not a reranker \(qwen3\.pooling_type"):
        engine(str(path), "torch", task="score")


def test_an_instruction_replaces_the_default(folders):
    """Qwen3-Reranker's task is part of its prompt: a caller's instruction takes the default's place (the model
    card's advice for other tasks); a cross-encoder has none to replace."""
    from lantern.app.models.qwen3_reranker import DEFAULT_INSTRUCTION

    task = "Given a code question, retrieve the snippet that answers it"
    llm = engine(folders["untied"], "torch")
    got = llm.score(QUERY, DOCS, instruction=task)
    text = TEMPLATE.replace(DEFAULT_INSTRUCTION, task)
    tok = AutoTokenizer.from_pretrained(folders["untied"])
    prompts = [tok(text.replace("{query}", QUERY).replace("{document}", d))["input_ids"] for d in DOCS]
    np.testing.assert_allclose([o.score for o in got], yes_probability(folders["untied"], prompts), atol=2e-5)
    assert got[0].score != llm.score(QUERY, DOCS[0])[0].score
    # Braces in the caller's texts are text: "{document}" in an instruction is not where the document goes.
    odd, doc = "find {document} for {query}", "the {query} itself"
    head, tail = TEMPLATE.split("{document}")
    filled = head.replace("{query}", QUERY).replace(DEFAULT_INSTRUCTION, odd) + doc + tail  # the slots filled once
    assert odd in filled and filled.count(doc) == 1
    want = yes_probability(folders["untied"], [tok(filled)["input_ids"]])[0]
    assert abs(llm.score(QUERY, doc, instruction=odd)[0].score - want) < 2e-5


def test_an_instruction_is_refused_by_cross_encoders(ggufs):
    from lantern.app.engine import InvalidRequestError

    llm = engine(str(ggufs["xlmr-f32"][0]), "torch")
    with pytest.raises(InvalidRequestError, match="cross-encoder") as err:
        llm.score(QUERY, DOCS, instruction="anything")
    assert err.value.param == "instruction"


def _score_with_salt(llm: LLM, pairs: list[tuple[str, str]], salt: str) -> list[float]:
    """Pairs queued together in one tenant's cache namespace (as the server queues a request's), run to the end."""
    eng = llm.engine
    ids = [tokenize_pair(eng, q, d)[0] for q, d in pairs]
    for i, one in enumerate(ids):
        eng.embedder.add(f"{salt}-{i}", one, None, salt)
    done: dict[str, float] = {}
    while len(done) < len(ids):
        for out in eng.step():
            done[out.request_id] = out.score
    return [done[f"{salt}-{i}"] for i in range(len(ids))]


def test_prompt_heads_come_from_the_prefix_cache(folders):
    """A reranker's prompt head and query are the same for every document: after the first pairs computed them,
    the others read them from the prefix cache (per tenant), and the scores stay transformers'."""
    llm = engine(folders["untied"], "torch", max_num_batched_tokens=160)  # a few pairs a step
    docs = [f"{d} Variant {i}." for i in range(3) for d in DOCS]
    scores = _score_with_salt(llm, [(QUERY, d) for d in docs], "tenant-a")
    stats = llm.engine.stats_snapshot()
    prompts = [prompt_ids(folders["untied"], QUERY, d) for d in docs]
    shared = next(i for i, (a, b) in enumerate(zip(prompts[0], prompts[1])) if a != b)  # the common head
    assert shared > 40 and stats["prefix_cache_hits"] >= (len(docs) - 2) * (shared // 4 * 4 - 4)
    np.testing.assert_allclose(scores, yes_probability(folders["untied"], prompts), atol=2e-5, rtol=0)
    hits = stats["prefix_cache_hits"]
    _score_with_salt(llm, [(QUERY, docs[0])], "tenant-b")  # another tenant: nothing of tenant-a's is read
    assert llm.engine.stats_snapshot()["prefix_cache_hits"] == hits
    _score_with_salt(llm, [(QUERY, docs[0])], "tenant-a")
    assert llm.engine.stats_snapshot()["prefix_cache_hits"] > hits


@pytest.mark.parametrize("tie", [True, False])
def test_mlx_community_quantized_reranker(folders, backend, tmp_path, tie):
    """A Qwen3-Reranker quantized by mlx_lm (as mlx-community publishes it, the head or tied table 4-bit too):
    the yes / no rows dequantized from their words, the scores mlx_lm's own forward gives (MLX exactly; torch
    through its int4 kernels, which quantize activations)."""
    import mlx.core as mx
    from mlx_lm.utils import load

    from tests.fixtures.teacher_forcing import quantized_by_mlx_lm

    src = folders["tied" if tie else "untied"]
    out = quantized_by_mlx_lm(src, tmp_path / "Qwen3-Reranker-tiny-4bit", bits=4, group_size=32)
    model, tok = load(str(out))
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    want = []
    for d in DOCS:
        ids = tok.encode(TEMPLATE.replace("{query}", QUERY).replace("{document}", d), add_special_tokens=False)
        logits = model(mx.array([ids]))[0, -1]
        want.append(float(mx.softmax(mx.stack([logits[yes], logits[no]]).astype(mx.float32))[0]))
    got = [o.score for o in engine(str(out), backend).score(QUERY, DOCS)]
    np.testing.assert_allclose(got, want, atol=1e-5 if backend == "mlx" else 3e-3, rtol=0)
