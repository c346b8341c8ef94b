"""Embeddings (`task="embed"`) on both backends against transformers' forward pass + the same
pooling + L2 normalization: a BERT encoder (mean and [CLS] pooling, sentence-transformers
folders), a decoder saved as its headless base model (Qwen3-Embedding's layout, last-token
pooling) and an ordinary causal-LM folder served for embeddings (mean pooling), with prompts
split into chunks, several inputs per step and preemption. Then the task / pooling defaults and
refusals, input validation, and each task refusing the other's requests."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lantern.app.engine import LLM, InvalidRequestError, SamplingParams
from lantern.app.models.loader import resolve_model
from lantern.app.models.pooling import resolve_task
from lantern.app.models.spec import UnsupportedModelError
from tests.fixtures.tiny_encoders import build_base_decoder, build_bert, write_sentence_transformers

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Numbers 0123456789",
    "Continuous batching lets new requests join while others decode, one token at a time. " * 2,
    "a",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("embed_models")
    return {
        "bert_mean": str(build_bert(root / "bert_mean", "mean")),
        "bert_cls": str(build_bert(root / "bert_cls", "cls", seed=1)),
        "qwen3_base": str(build_base_decoder(root / "qwen3_base", "qwen3", "last")),
        "llama": tiny_model_dir("llama2"),  # a *ForCausalLM folder with its head: not an embedding model
    }


def reference(folder: str, texts: list[str], pooling: str) -> list[np.ndarray]:
    """transformers' base model, its last_hidden_state pooled and L2-normalized."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    base = getattr(model, "model", model)  # a causal-LM folder: its backbone
    out = []
    for text in texts:
        ids = torch.tensor([tok.encode(text)])
        with torch.no_grad():
            h = base(input_ids=ids).last_hidden_state[0]
        v = {"mean": h.mean(0), "last": h[-1], "cls": h[0]}[pooling]
        out.append(torch.nn.functional.normalize(v, dim=0).numpy())
    return out


def engine(folder: str, backend: str, **options) -> LLM:
    opts = dict(dtype="float32", block_size=4, num_kv_blocks=256, prefill_chunk_size=8)
    return LLM(model=folder, backend=backend, **{**opts, **options})


CASES = [
    ("bert_mean", "mean", {}),
    ("bert_cls", "cls", {}),
    ("qwen3_base", "last", {}),  # the folder's 1_Pooling says last-token
    ("llama", "mean", {"task": "embed", "pooling": "mean"}),
    ("llama", "last", {"task": "embed"}),  # a decoder's default pooling
]


@pytest.mark.parametrize("name,pooling,options", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_vectors_match_transformers(folders, backend, name, pooling, options):
    llm = engine(folders[name], backend, **options)
    assert (llm.engine.task, llm.engine.embedder.pooling) == ("embed", pooling)
    outs = llm.embed(TEXTS)
    tok = llm.tokenizer
    for text, out, want in zip(TEXTS, outs, reference(folders[name], TEXTS, pooling)):
        assert out.num_prompt_tokens == len(tok.encode(text))
        assert out.embedding.dtype == np.float32 and out.embedding.shape == want.shape
        np.testing.assert_allclose(out.embedding, want, atol=1e-4, rtol=0)
        assert abs(float(np.linalg.norm(out.embedding)) - 1.0) < 1e-5
    if name.startswith("bert"):  # an encoder's inputs each ran in one piece, whatever the chunk size
        assert llm.engine.scheduler.config.whole_prompts
    stats = llm.engine.stats_snapshot()
    # A decoder's last-token inputs go through the prefix cache; mean-pooled and encoder inputs never do.
    assert (stats["prefix_cache_queries"] > 0) == (pooling == "last")
    assert stats["num_free_blocks"] == stats["num_blocks"]


def test_token_ids_and_one_input(folders, backend):
    llm = engine(folders["bert_mean"], backend)
    ids = llm.tokenizer.encode(TEXTS[0])
    by_text, by_ids = llm.embed(TEXTS[0])[0], llm.embed(ids)[0]
    np.testing.assert_array_equal(by_text.embedding, by_ids.embedding)


def test_preempted_inputs_are_recomputed(folders, backend):
    """A pool too small for both long inputs at once: one is preempted mid-prompt and recomputed,
    its running mean restarted, and both still match transformers."""
    texts = [TEXTS[2], TEXTS[2].replace("Continuous", "Paged")]  # ~86 tokens: 22 blocks each, 40 in the pool
    llm = engine(folders["llama"], backend, task="embed", pooling="mean", num_kv_blocks=40, max_model_len=128)
    outs = llm.embed(texts)
    assert llm.engine.stats_snapshot()["num_preemptions"] > 0
    for out, want in zip(outs, reference(folders["llama"], texts, "mean")):
        np.testing.assert_allclose(out.embedding, want, atol=1e-4, rtol=0)


def test_async_engine_embeds_and_aborts(folders):
    """AsyncEngine.embed: a caller cancelled while waiting aborts its input (its blocks go back);
    the next input is served as usual."""
    import asyncio
    import time

    from lantern.app.engine import AsyncEngine

    eng = AsyncEngine(model=folders["llama"], backend="torch", dtype="float32", block_size=4, num_kv_blocks=64)
    assert eng.task == "generate"
    eng.shutdown()
    eng = AsyncEngine(model=folders["llama"], backend="torch", dtype="float32", block_size=4, task="embed")
    try:
        ids = eng.encode(TEXTS[2])
        eng.validate_embedding(ids)

        async def main():
            waiting = asyncio.ensure_future(eng.embed(ids, "gone"))
            await asyncio.sleep(0)  # queued, waiting for its vector
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            return await eng.embed(ids, "kept")

        out = asyncio.run(main())
        assert out.request_id == "kept" and out.embedding.shape == (eng.embedding_size,)
        np.testing.assert_allclose(out.embedding, reference(folders["llama"], [TEXTS[2]], "last")[0], atol=1e-4)
        deadline = time.monotonic() + 10
        while eng.stats()["num_free_blocks"] != eng.stats()["num_blocks"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert eng.stats()["num_free_blocks"] == eng.stats()["num_blocks"]
    finally:
        eng.shutdown()


def test_input_validation(folders):
    llm = engine(folders["bert_mean"], "torch")  # max_position_embeddings 64
    limit = llm.engine.max_model_len
    assert limit == 64
    longest = [2] + [7] * (limit - 2) + [3]
    want = _bert_ids_reference(folders["bert_mean"], longest)
    np.testing.assert_allclose(llm.embed(longest)[0].embedding, want, atol=1e-4, rtol=0)
    for bad, code in (([], None), ([2, 10**6], None), ([2] * (limit + 1), "context_length_exceeded")):
        with pytest.raises(InvalidRequestError) as err:
            llm.embed([bad])
        assert err.value.param == "input" and err.value.code == code


def _bert_ids_reference(folder: str, ids: list[int]) -> np.ndarray:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        h = model(input_ids=torch.tensor([ids])).last_hidden_state[0].mean(0)
    return torch.nn.functional.normalize(h, dim=0).numpy()


def test_each_task_refuses_the_other(folders):
    embedder = engine(folders["bert_mean"], "torch")
    with pytest.raises(InvalidRequestError, match="serves embeddings") as err:
        embedder.generate("hello", SamplingParams(max_tokens=2))
    assert err.value.param == "model" and err.value.code == "wrong_task"
    generator = engine(folders["llama"], "torch")
    assert generator.engine.task == "generate"
    with pytest.raises(InvalidRequestError, match="serves text generation") as err:
        generator.embed("hello")
    assert err.value.param == "model"


# ---- task and pooling from the folder ----------------------------------------------------------
def _spec(folder: str):
    return resolve_model(folder).spec


def test_defaults_from_the_folder(folders, tmp_path):
    assert resolve_task("auto", "auto", _spec(folders["bert_mean"])) == ("embed", "mean")
    assert resolve_task("auto", "auto", _spec(folders["bert_cls"])) == ("embed", "cls")
    assert resolve_task("auto", "auto", _spec(folders["qwen3_base"])) == ("embed", "last")
    assert resolve_task("auto", "auto", _spec(folders["llama"])) == ("generate", None)
    assert resolve_task("embed", "auto", _spec(folders["llama"])) == ("embed", "last")
    assert resolve_task("auto", "mean", _spec(folders["qwen3_base"])) == ("embed", "mean")  # the flag wins
    # A BERT folder without sentence-transformers files: mean pooling; an *Embedding* architecture: embed.
    plain = build_bert(tmp_path / "plain_bert", pooling=None)
    assert resolve_task("auto", "auto", _spec(str(plain))) == ("embed", "mean")
    named = build_base_decoder(tmp_path / "named", pooling=None)
    cfg = json.loads((named / "config.json").read_text())
    (named / "config.json").write_text(json.dumps({**cfg, "architectures": ["Qwen3ForEmbedding"]}))
    assert resolve_task("auto", "auto", _spec(str(named))) == ("embed", "last")


def test_refusals_name_the_key(folders, tmp_path):
    with pytest.raises(ValueError, match="encoder: it serves embeddings only"):
        resolve_task("generate", "auto", _spec(folders["bert_mean"]))
    with pytest.raises(ValueError, match="--pooling applies to embeddings"):
        resolve_task("generate", "mean", _spec(folders["llama"]))
    dense = build_bert(tmp_path / "dense", pooling="mean")
    write_sentence_transformers(
        dense, "mean", 64, [{"idx": 3, "path": "3_CNN", "type": "sentence_transformers.models.CNN"}]
    )
    with pytest.raises(UnsupportedModelError, match=r"sentence_transformers\.models\.CNN"):
        resolve_task("auto", "auto", _spec(str(dense)))
    maxed = build_bert(tmp_path / "maxed", pooling="mean")
    cfg_file = maxed / "1_Pooling" / "config.json"
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()), "pooling_mode_max_tokens": True}))
    with pytest.raises(UnsupportedModelError, match="pooling_mode_max_tokens=true"):
        resolve_task("auto", "auto", _spec(str(maxed)))
    relative = build_bert(tmp_path / "relative", pooling="mean")
    cfg = json.loads((relative / "config.json").read_text())
    (relative / "config.json").write_text(json.dumps({**cfg, "position_embedding_type": "relative_key"}))
    with pytest.raises(UnsupportedModelError, match="position_embedding_type"):
        resolve_model(str(relative))
    with pytest.raises(ValueError, match="tensor parallelism"):
        LLM(model=folders["bert_mean"], backend="torch", dtype="float32", tensor_parallel_size=2)


# ---- GGUF embedding models: the pooling the file declares ----------------------------------------
@pytest.fixture(scope="module")
def qwen3_gguf(tmp_path_factory):
    """A tiny Qwen3 written as llama.cpp's converter writes Qwen3-Embedding: qwen3.pooling_type LAST."""
    import gguf

    from tests.fixtures.gguf_families import convert_to_gguf
    from tests.fixtures.tiny_models import build_model

    root = tmp_path_factory.mktemp("qwen3-embed-gguf")
    src = build_model("qwen3", root / "hf")
    return convert_to_gguf(src, root, "f32", pooling_type=int(gguf.PoolingType.LAST))


def test_gguf_pooling_type_serves_embeddings(qwen3_gguf, backend, tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    path, ref = qwen3_gguf
    assert resolve_task("auto", "auto", _spec(str(path))) == ("embed", "last")
    assert resolve_task("generate", "auto", _spec(str(path))) == ("generate", None)  # the flag wins
    llm = engine(str(path), backend)
    assert (llm.engine.task, llm.engine.embedder.pooling) == ("embed", "last")
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(ref), dtype=torch.float32).eval()  # the backbone
    for text, out in zip(TEXTS, llm.embed(TEXTS)):
        # The file's own tokenizer (its pre-tokenizer splits digits, the tiny folder's does not).
        ids = llm.tokenizer.encode(text)
        with torch.no_grad():
            last = model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
        want = torch.nn.functional.normalize(last, dim=0).numpy()
        np.testing.assert_allclose(out.embedding, want, atol=1e-4, rtol=0)


def test_gguf_rank_pooling_serves_scores(tmp_path, monkeypatch):
    """RANK pooling is a reranker's (tests/models/test_rerankers.py): scores by default, embeddings refused; a file
    stating it without the head's tensors is refused naming the tensor."""
    import gguf

    from tests.fixtures.gguf_families import convert_to_gguf
    from tests.fixtures.tiny_models import build_model

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    path, _ = convert_to_gguf(
        build_model("qwen3", tmp_path / "hf"), tmp_path, "f32", pooling_type=int(gguf.PoolingType.RANK)
    )
    assert resolve_task("auto", "auto", _spec(str(path))) == ("score", "last")
    with pytest.raises(ValueError, match=r"reranker \(pooling_type rank\)"):
        resolve_task("embed", "auto", _spec(str(path)))
    with pytest.raises(UnsupportedModelError, match=r"without its cls\.output tensor"):
        LLM(model=str(path), backend="torch", dtype="float32")


# ---- sentence-transformers Dense modules after the pooling -----------------------------------------
def _dense_folder(root, *, bin_second: bool = False):
    """A BERT folder whose modules are Transformer, Pooling (mean), a tanh Dense 64 -> 32 with a bias, an identity
    Dense 32 -> 48 without one (pytorch_model.bin when bin_second, as older folders saved it), Normalize."""
    from safetensors.torch import save_file

    folder = build_bert(root, pooling=None, seed=4)
    torch.manual_seed(5)
    layers = [torch.nn.Linear(64, 32), torch.nn.Linear(32, 48, bias=False)]
    acts = ["torch.nn.modules.activation.Tanh", "torch.nn.modules.linear.Identity"]
    modules = []
    for i, (layer, act) in enumerate(zip(layers, acts)):
        where = folder / f"{i + 2}_Dense"
        where.mkdir()
        cfg = {"in_features": layer.in_features, "out_features": layer.out_features, "bias": layer.bias is not None}
        (where / "config.json").write_text(json.dumps({**cfg, "activation_function": act}))
        state = {f"linear.{k}": v.detach().clone().contiguous() for k, v in layer.state_dict().items()}
        if bin_second and i == 1:
            torch.save(state, where / "pytorch_model.bin")
        else:
            save_file(state, str(where / "model.safetensors"))
        modules.append(
            {"idx": i + 2, "name": str(i + 2), "path": where.name, "type": "sentence_transformers.models.Dense"}
        )
    write_sentence_transformers(folder, "mean", 64)
    listed = json.loads((folder / "modules.json").read_text())
    normalize = [m for m in listed if m["type"].endswith("Normalize")]
    (folder / "modules.json").write_text(json.dumps([*listed[:2], *modules, *normalize]))
    return folder, layers


@pytest.mark.parametrize("bin_second", [False, True], ids=["safetensors", "pytorch_model.bin"])
def test_dense_modules_project_the_pooled_vector(tmp_path, backend, bin_second):
    folder, layers = _dense_folder(tmp_path / "dense", bin_second=bin_second)
    llm = engine(str(folder), backend)
    assert llm.engine.embedder.size == 48
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    for text, out in zip(TEXTS, llm.embed(TEXTS)):
        ids = llm.tokenizer.encode(text)
        with torch.no_grad():
            pooled = model(input_ids=torch.tensor([ids])).last_hidden_state[0].mean(0)
            want = torch.nn.functional.normalize(layers[1](torch.tanh(layers[0](pooled))), dim=0).numpy()
        assert out.embedding.shape == (48,)
        np.testing.assert_allclose(out.embedding, want, atol=1e-4, rtol=0)


def test_dense_module_refusals(tmp_path):
    folder, _ = _dense_folder(tmp_path / "dense")
    cfg_file = folder / "2_Dense" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg_file.write_text(json.dumps({**cfg, "activation_function": "torch.nn.modules.activation.GELU"}))
    with pytest.raises(UnsupportedModelError, match="activation_function"):
        LLM(model=str(folder), backend="torch", dtype="float32")
    cfg_file.write_text(json.dumps(cfg))
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps([modules[0], modules[2], modules[1], *modules[3:]]))
    with pytest.raises(UnsupportedModelError, match="before the Pooling module"):
        resolve_task("auto", "auto", _spec(str(folder)))
