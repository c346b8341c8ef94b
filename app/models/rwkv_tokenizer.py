"""RWKV's World tokenizer (RWKV-5/6/7 folders: tokenizer_class RwkvTokenizer, remote code, over
rwkv_vocab_v20230424.txt) as a transformers tokenizer, without running the folder's code.

The tokenization is a greedy longest match over the text's UTF-8 bytes against the vocabulary (BlinkDL's
TRIE_TOKENIZER); pyrwkv_tokenizer computes it (Rust, checked by its authors against that reference; the tests hold it
to the reference too). Each vocabulary line is `<id> <Python literal of the str or bytes> <byte length>`. A token's
text here is its text where its bytes are whole UTF-8 (so a special token such as "✿" is found by its text), else
each byte as a character of Unicode's plane-15 private use area (U+F0000 + byte: no World token holds one), so
tokens that split a character keep their bytes and decoding joins them back before reading UTF-8. The folder's added
and special tokens, and its chat template, come from its tokenizer_config.json as for any transformers tokenizer.
"""

from __future__ import annotations

import ast
import codecs
import shutil
import tempfile
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizer

VOCAB_FILE = "rwkv_vocab_v20230424.txt"
_BYTE = 0xF0000  # a byte of a token that is not whole UTF-8: chr(_BYTE + byte)
_GAP = 0xF0100  # an id the vocabulary file skips (0: the folders' end-of-text token): chr(_GAP + n) in get_vocab


def read_vocabulary(path: str) -> dict[int, bytes]:
    """id -> the token's bytes, each line checked against its stated length (literals parsed, never run)."""
    tokens: dict[int, bytes] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            head, _, rest = line.partition(" ")
            literal, _, length = rest.rpartition(" ")
            value = ast.literal_eval(literal)
            data = value.encode("utf-8") if isinstance(value, str) else value
            if not isinstance(data, bytes) or len(data) != int(length):
                raise ValueError(f"{path}:{number}: not `<id> <str or bytes literal> <byte length>`")
            tokens[int(head)] = data
    return tokens


def write_vocabulary(path: str, tokens: dict[int, bytes]) -> None:
    """The file read_vocabulary reads: a str literal where the bytes are whole UTF-8, else a bytes literal."""
    lines = []
    for i, data in sorted(tokens.items()):
        try:
            literal = repr(data.decode("utf-8"))
        except UnicodeDecodeError:
            literal = repr(data)
        lines.append(f"{i} {literal} {len(data)}\n")
    Path(path).write_text("".join(lines), encoding="utf-8")


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(chr(_BYTE + b) for b in data)


class RwkvWorldTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": VOCAB_FILE}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str, **kwargs: Any):
        from pyrwkv_tokenizer import WorldTokenizer

        self.vocab_file = vocab_file
        self._matcher = WorldTokenizer(vocab_file)
        self._bytes = read_vocabulary(vocab_file)
        self._texts = {i: _text(data) for i, data in self._bytes.items()}
        self._ids = {text: i for i, text in self._texts.items()}
        # (transformers numbers a new added token len(get_vocab()): each skipped id holds a place there)
        gaps = [i for i in range(max(self._bytes) + 1) if i not in self._bytes]
        self._gaps = {chr(_GAP + n): i for n, i in enumerate(gaps)}
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return max(self._bytes) + 1  # (id 0 is the end-of-text token the folders add)

    def get_vocab(self) -> dict[str, int]:
        """Every id once (a skipped id by its placeholder unless an added token holds it): its size, which
        transformers takes as len(tokenizer) and numbers a new token by, is one past the last id."""
        gaps = {text: i for text, i in self._gaps.items() if i not in self.added_tokens_decoder}
        return {**gaps, **self._ids, **self.added_tokens_encoder}

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [self._texts[i] for i in self._matcher.encode(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self._ids.get(token, self.unk_token_id if self.unk_token_id is not None else 0)

    def _convert_id_to_token(self, index: int) -> str:
        return self._texts.get(index, self.unk_token or "")

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        text = "".join(tokens)
        data = bytearray()
        for ch in text:
            code = ord(ch)
            data += bytes((code - _BYTE,)) if _BYTE <= code < _BYTE + 256 else ch.encode("utf-8")
        return data.decode("utf-8", errors="replace")

    def byte_tokens(self, n_vocab: int) -> tuple[list[bytes], list[int]]:
        """(each id's bytes for the model's n_vocab rows, the special ids): what constrained decoding's token masks
        are built from (app/engine/structured.py; an added token is its text, a row past every token a placeholder)."""
        tokens = [self._bytes.get(i, b"") for i in range(n_vocab)]
        special = [i for i in self.added_tokens_decoder if i < n_vocab]
        for i, token in self.added_tokens_decoder.items():
            if i < n_vocab:
                tokens[i] = str(token).encode("utf-8")
        for i in range(n_vocab):
            if not tokens[i]:
                tokens[i] = f"<[unused {i}]>".encode()
                special.append(i)
        return tokens, sorted(set(special))

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        target = str(Path(save_directory) / ((filename_prefix + "-" if filename_prefix else "") + VOCAB_FILE))
        write_vocabulary(target, self._bytes)
        return (target,)


_CONTROL, _UNUSED = 3, 5  # gguf.TokenType

# llama.cpp's built-in "rwkv-world" chat format (llama-chat.cpp) as a template: what a GGUF whose converter found no
# Jinja file states by that name. System / User / Assistant turns, each trimmed and closed by a blank line.
RWKV_WORLD_TEMPLATE = (
    "{% set names = {'system': 'System', 'user': 'User', 'assistant': 'Assistant'} %}{% for m in messages %}"
    "{% if m['role'] in names %}{{ names[m['role']] + ': ' + m['content'] | trim + '\\n\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def gguf_tokenizer(path: Path, metadata: dict[str, Any]) -> RwkvWorldTokenizer:
    """The World tokenizer of an RWKV GGUF (tokenizer.ggml.model "rwkv"): llama.cpp's converter stores each token's
    bytes as the body of their Python bytes literal (unescaped here), `<s>` as control token 0 and padding past the
    vocabulary. Its bos / eos / unk / padding ids as the file states them (`<s>` where it states none); an eos that
    is the end-of-turn token ("\\n\\n", 261) stays an ordinary token, as llama.cpp keeps it (the config's
    eos_token_id list stops generation there). Its chat template as the file states it (llama.cpp's "rwkv-world"
    name: RWKV_WORLD_TEMPLATE)."""
    import gguf
    from transformers import AddedToken

    reader = gguf.GGUFReader(str(path))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    vocabulary, specials = {}, {}
    for i, (text, kind) in enumerate(zip(tokens, types)):
        if kind == _CONTROL:
            specials[i] = text
        elif kind != _UNUSED:
            vocabulary[i] = codecs.escape_decode(text.encode("utf-8"))[0]
    folder = tempfile.mkdtemp(prefix="lantern-rwkv-")
    try:
        write_vocabulary(str(Path(folder) / VOCAB_FILE), vocabulary)
        first = specials.get(0)

        def named(key: str) -> str | None:  # (a control token the file names; else `<s>`)
            token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
            return specials.get(int(token_id), first) if token_id is not None else first

        tokenizer = RwkvWorldTokenizer(
            vocab_file=str(Path(folder) / VOCAB_FILE),
            added_tokens_decoder={i: AddedToken(t, special=True, normalized=False) for i, t in specials.items()},
            bos_token=named("bos"),
            eos_token=named("eos"),
            unk_token=named("unknown"),
            pad_token=named("padding"),
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # (read: the tokenizer holds the vocabulary in memory)
    template = metadata.get("tokenizer.chat_template")
    tokenizer.chat_template = RWKV_WORLD_TEMPLATE if template == "rwkv-world" else template
    return tokenizer
