"""Fast start on a GGUF model: the tokenizer and config transformers rebuilds from GGUF metadata are
cached (keyed by the file, written atomically, rebuilt when damaged), and the weights' tensor
directory is read without parsing the metadata arrays. On SmolLM2's GGUF, as `lantern serve` uses."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from lantern.app.models import loader
from lantern.app.models.gguf_names import read_gguf_index
from lantern.app.models.spec import ModelConfig
from tests.fixtures.tiny_models import CORPUS

pytestmark = pytest.mark.slow
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def reference(gguf_path):
    """transformers' own conversion, straight from the GGUF (what every start did before)."""
    return loader._convert_gguf(gguf_path)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def model_file(gguf_path, tmp_path):
    """A private copy (by hard link when possible) whose mtime a test may change."""
    dest = tmp_path / "model" / gguf_path.name
    dest.parent.mkdir()
    try:
        os.link(gguf_path, dest)
    except OSError:
        shutil.copy(gguf_path, dest)
    return dest


def same_tokenizer(a, b) -> None:
    assert a.get_vocab() == b.get_vocab()
    assert a.chat_template == b.chat_template
    assert (a.bos_token_id, a.eos_token_id, a.pad_token_id, a.unk_token_id) == (
        b.bos_token_id,
        b.eos_token_id,
        b.pad_token_id,
        b.unk_token_id,
    )
    assert {i: str(t) for i, t in a.added_tokens_decoder.items()} == {
        i: str(t) for i, t in b.added_tokens_decoder.items()
    }
    texts = [*CORPUS, "  leading spaces\n\n\ttabs", "<|im_start|>user\nhi<|im_end|>", "caf\u00e9 \U0001f600 12345"]
    for text in texts:
        assert a.encode(text) == b.encode(text)
        assert a.decode(a.encode(text)) == b.decode(b.encode(text))
    assert a.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == b.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )


def test_second_load_reads_the_cache_and_matches_the_conversion(gguf_path, reference, cache, monkeypatch):
    ref_cfg, ref_tok = reference
    calls = []
    monkeypatch.setattr(loader, "_convert_gguf", lambda p: calls.append(p) or reference)
    cfg1, tok1 = loader.gguf_config_and_tokenizer(gguf_path)
    assert calls == [gguf_path] and tok1 is ref_tok
    entries = list((cache / "tokenizers").iterdir())
    assert len(entries) == 1 and (entries[0] / "gguf_config.json").is_file()  # no temp dir left behind

    def no_conversion(path):
        raise AssertionError("converted again instead of reading the cache")

    monkeypatch.setattr(loader, "_convert_gguf", no_conversion)
    cfg2, tok2 = loader.gguf_config_and_tokenizer(gguf_path)
    same_tokenizer(tok2, ref_tok)
    assert ModelConfig.from_hf(cfg2) == ModelConfig.from_hf(ref_cfg) == ModelConfig.from_hf(cfg1)
    loaded = loader.resolve_model(str(gguf_path))  # the path the engine takes
    assert loaded.chat_template == ref_tok.chat_template and loaded.eos_token_ids == [ref_tok.eos_token_id]


def test_a_changed_file_gets_a_fresh_entry(gguf_path, reference, cache, tmp_path, monkeypatch):
    path = model_file(gguf_path, tmp_path)
    first = loader.gguf_cache_folder(path)
    loader._save_atomically(first, *reference)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert loader.gguf_cache_folder(path) != first
    calls = []
    monkeypatch.setattr(loader, "_convert_gguf", lambda p: calls.append(p) or reference)
    loader.gguf_config_and_tokenizer(path)
    assert calls == [path]
    assert len(list((cache / "tokenizers").iterdir())) == 2


def test_a_damaged_entry_is_rebuilt(gguf_path, reference, cache, monkeypatch):
    folder = loader.gguf_cache_folder(gguf_path)
    loader._save_atomically(folder, *reference)
    (folder / "tokenizer.json").write_text("{ truncated")
    calls = []
    monkeypatch.setattr(loader, "_convert_gguf", lambda p: calls.append(p) or reference)
    _, tok = loader.gguf_config_and_tokenizer(gguf_path)
    assert calls == [gguf_path]
    same_tokenizer(tok, reference[1])
    _, tok = loader.gguf_config_and_tokenizer(gguf_path)  # and the rebuilt entry is read back
    assert calls == [gguf_path]
    same_tokenizer(tok, reference[1])


def test_tensor_index_equals_the_gguf_reader(gguf_path):
    import gguf

    index = read_gguf_index(str(gguf_path))
    reader = gguf.GGUFReader(str(gguf_path))
    assert index.architecture == reader.fields["general.architecture"].contents()
    assert index.metadata["llama.context_length"] == reader.fields["llama.context_length"].contents()
    assert [t.name for t in index.tensors] == [t.name for t in reader.tensors]
    for mine, ref in zip(index.tensors, reader.tensors):
        assert mine.tensor_type == ref.tensor_type
        assert mine.shape == tuple(int(d) for d in ref.shape)
        assert mine.data.dtype == ref.data.dtype and mine.data.shape == ref.data.shape
        assert np.array_equal(mine.data, ref.data)
