"""A folder's tokenizer is loaded without running the folder's own code: a remote-code tokenizer class (InternLM2's,
Baichuan's: auto_map in tokenizer_config.json) neither imports it nor prompts on the console. Its tokenizer.json then
loads as the tokenizers library's own file; a SentencePiece tokenizer.model as Llama's tokenizer (what transformers'
LlamaTokenizerFast makes of the same file), with a warning naming the class; with neither, one line naming it."""

from __future__ import annotations

import json
import logging

import pytest

from lantern.app.models.loader import resolve_model
from lantern.app.models.spec import UnsupportedModelError
from tests.fixtures.tiny_models import build_model

REMOTE = {
    "tokenizer_class": "InternLM2Tokenizer",
    "auto_map": {"AutoTokenizer": ["tokenization_internlm2.InternLM2Tokenizer", None]},
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "add_bos_token": True,
}


@pytest.fixture()
def folder(tmp_path):
    out = build_model("llama2", tmp_path / "remote")
    for f in out.glob("tokenizer*"):
        f.unlink()
    (out / "tokenizer_config.json").write_text(json.dumps(REMOTE))
    return out


def _sentencepiece_model(out) -> None:
    import sentencepiece as spm

    corpus = out.parent / "corpus.txt"
    corpus.write_text("\n".join(["paged attention keeps every block", "the quick brown fox jumps over"] * 40))
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(out / "tokenizer"),
        vocab_size=320,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,  # (as real tokenizers keep their spaces)
        minloglevel=2,
    )
    (out / "tokenizer.vocab").unlink()


def test_a_remote_sentencepiece_tokenizer_is_read_as_llamas(folder, caplog):
    """The ids are SentencePiece's own for the file (after the BOS the class adds), and `</s>` stays one token.
    (Text that starts with a space, or follows a special token, is where Llama's tokenizer and SentencePiece part:
    the warning says so.)"""
    import sentencepiece as spm

    _sentencepiece_model(folder)
    with caplog.at_level(logging.WARNING):
        tokenizer = resolve_model(str(folder)).tokenizer
    assert "InternLM2Tokenizer" in caplog.text
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    for text in ["the quick fox", "paged blocks\n\nover  jumps ", "ünï 12"]:
        assert tokenizer.encode(text) == [sp.bos_id(), *sp.encode(text)], text
    assert tokenizer.encode("over</s>jumps").count(sp.eos_id()) == 1


def test_a_remote_class_with_a_tokenizer_json_loads_the_file(folder, tmp_path):
    src = build_model("llama2", tmp_path / "plain")
    (folder / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())
    tokenizer = resolve_model(str(folder)).tokenizer
    assert tokenizer.encode("paged attention") == resolve_model(str(src)).tokenizer.encode("paged attention")


def test_a_remote_class_without_its_files_is_refused_naming_it(folder):
    with pytest.raises(UnsupportedModelError, match="InternLM2Tokenizer"):
        resolve_model(str(folder))
