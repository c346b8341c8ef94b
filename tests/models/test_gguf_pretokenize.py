"""GGUF byte-level BPE tokenizers split text as llama.cpp does for their tokenizer.ggml.pre name, where
transformers' reader would split it as GPT-2 (app/models/gguf_pretokenize.py).

Where transformers has the same split under another name (GLM-4's is Llama 3's, StableLM 2's and Hunyuan's are
Qwen2's), the split is checked against transformers' own; for the rest, against what llama.cpp's regexes do to
numbers, CJK runs and punctuation. (Against llama-server's /tokenize on these texts, every name here gave the
same ids: `python scripts/check_gguf_vs_llamacpp.py --server PATH --tokenizers`.)"""

from __future__ import annotations

import pytest

from lantern.app.models.gguf_pretokenize import IGNORE_MERGES, SPLITS
from lantern.app.models.loader import resolve_model
from tests.fixtures.gguf_writer import write_gguf_model

TEXTS = [
    "The year 2024 had 365 days and 12345678 seconds.",
    "Don't you'll WE'RE it's",
    "\u4f60\u597d\u4e16\u754c, \u3053\u3093\u306b\u3061\u306f \uc548\ub155\ud558\uc138\uc694 test",
    "a  b   c\n\n\tindent\r\nend  ",
    "x=1+2; y->z; (foo)[bar]{baz}!?",
]


def _pieces(pre: str, text: str) -> list[str]:
    from tokenizers import Regex, pre_tokenizers

    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in SPLITS[pre]]
    return [p for p, _ in pre_tokenizers.Sequence(splits).pre_tokenize_str(text)]


@pytest.mark.parametrize("pre,same_as", [("glm4", "llama3"), ("chatglm-bpe", "llama3"), ("stablelm2", "qwen2")])
def test_splits_equal_transformers_where_it_has_them(pre, same_as):
    tables = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    from tokenizers import Regex, pre_tokenizers

    theirs = pre_tokenizers.Split(Regex(tables.GGUF_PRE_TOKENIZER_SPLITS[same_as]), behavior="isolated")
    for text in TEXTS:
        assert _pieces(pre, text) == [p for p, _ in theirs.pre_tokenize_str(text)], text


@pytest.mark.parametrize(
    "pre,text,pieces",
    [
        ("deepseek-v3", "in 12345678 ways", ["in", " ", "123", "456", "78", " ways"]),
        ("deepseek-v3", "\u4f60\u597d,\u4e16\u754c", ["\u4f60\u597d", ",", "\u4e16\u754c"]),
        ("deepseek-coder", "v12 ab", ["v", "1", "2", " ab"]),
        ("deepseek-llm", "v12 ab", ["v", "12", " ab"]),
        ("falcon", "n=12345678!", ["n", "=", "123", "456", "78", "!"]),
        ("smollm", "in 2024", ["in", " ", "2", "0", "2", "4"]),
        ("command-r", "in 2024", ["in", " ", "2", "0", "2", "4"]),
        ("bloom", "Hi, you!", ["Hi", ",", " you", "!"]),
        ("hunyuan", "in 2024", ["in", " ", "2", "0", "2", "4"]),
        # Arcee Trinity: groups of three from the right (llama.cpp's AFMoE_digits), CJK runs apart
        ("afmoe", "in 12345678 ways", ["in", " ", "12", "345", "678", " ways"]),
        ("afmoe", "x=1000,7", ["x", "=", "1", "000", ",", "7"]),
        ("afmoe", "\u4f60\u597d,\u4e16\u754c", ["\u4f60\u597d", ",", "\u4e16\u754c"]),
        # Kimi K2: Han runs apart from the words around them (its class intersection), numbers in threes
        ("kimi-k2", "ok\u4f60\u597dyes 12345", ["ok", "\u4f60\u597d", "yes", " ", "123", "45"]),
        # Tiny Aya / Cohere2-MoE: groups of three from the right
        ("tiny_aya", "in 12345678 ways", ["in", " ", "12", "345", "678", " ways"]),
        # K-EXAONE: a word runs on over single spaces
        ("exaone-moe", "one two  three", ["one two", " ", " three"]),
        # Ling / Ring: Qwen2's single digits, newlines one run at a time after a space
        ("bailingmoe2", "a 12\n\nb", ["a", " ", "1", "2", "\n\n", "b"]),
        ("laguna", "x 12\ny", ["x", " ", "1", "2", "\n", "y"]),
        ("youtu", "\uc548\ub155 \u4f60\u597d 42", ["\uc548\ub155", " ", "\u4f60\u597d", " ", "4", "2"]),
    ],
)
def test_llama_cpp_splits(pre, text, pieces):
    assert _pieces(pre, text) == pieces


@pytest.mark.parametrize("pre", ["deepseek-v3", "glm4", "default"])
def test_a_gguf_file_gets_its_split(tmp_path, monkeypatch, pre):
    """Loaded from a file: the tokenizer's pre-tokenizer is the table's (then byte-level), whole words first for
    GLM-4; a name llama.cpp's converter writes for vocabularies it does not recognise ("default") is left to
    transformers."""
    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    path, _ = write_gguf_model(tmp_path / pre, arch="llama", qtype="Q8_0", pre=pre)
    tokenizer = resolve_model(str(path)).tokenizer
    backend = tokenizer.backend_tokenizer
    split = [p for p, _ in backend.pre_tokenizer.pre_tokenize_str("in 12345678")]
    assert split == (["in", "\u0120", "123", "456", "78"] if pre != "default" else ["in", "\u012012345678"])
    assert backend.model.ignore_merges == (pre in IGNORE_MERGES)


def test_a_split_not_rebuilt_is_refused_by_name(tmp_path, monkeypatch):
    """Sarvam-30B's SentencePiece-style BPE (raw UTF-8, spaces as U+2581) is not GPT-2's byte-level split: refused."""
    from lantern.app.models.spec import UnsupportedModelError

    monkeypatch.setenv("LANTERN_CACHE", str(tmp_path / "cache"))
    path, _ = write_gguf_model(tmp_path / "sarvam", arch="llama", qtype="Q8_0", pre="sarvam-moe")
    with pytest.raises(UnsupportedModelError, match=r"tokenizer\.ggml\.pre='sarvam-moe'"):
        resolve_model(str(path))
