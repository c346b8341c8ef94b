"""RWKV's World tokenizer (RWKV-5/6/7 folders: tokenizer_class RwkvTokenizer, remote code, over
rwkv_vocab_v20230424.txt) as a transformers tokenizer, without running the folder's code.

The tokenization is a greedy longest match over the text's UTF-8 bytes against the vocabulary (BlinkDL's
TRIE_TOKENIZER); pyrwkv_tokenizer computes it (Rust, checked by its authors against that reference; the tests hold it
to the reference too). Each vocabulary line is `<id> <Python literal of the str or bytes> <byte length>`; a token's
text here is its bytes read as Latin-1 (one character per byte, so tokens that split a character keep their bytes
and decoding joins them back before reading UTF-8). The folder's added and special tokens, and its chat template,
come from its tokenizer_config.json as for any transformers tokenizer.
"""

from __future__ import annotations

import ast
import codecs
import os
import tempfile
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizer

VOCAB_FILE = "rwkv_vocab_v20230424.txt"


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


class RwkvWorldTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": VOCAB_FILE}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file: str, **kwargs: Any):
        from pyrwkv_tokenizer import WorldTokenizer

        self.vocab_file = vocab_file
        self._matcher = WorldTokenizer(vocab_file)
        self._bytes = read_vocabulary(vocab_file)
        self._ids = {data.decode("latin-1"): i for i, data in self._bytes.items()}
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        super().__init__(**kwargs)

    @property
    def vocab_size(self) -> int:
        return max(self._bytes) + 1  # (id 0 is the end-of-text token the folders add)

    def get_vocab(self) -> dict[str, int]:
        return {**self._ids, **self.added_tokens_encoder}

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [self._bytes[i].decode("latin-1") for i in self._matcher.encode(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self._ids.get(token, self.unk_token_id if self.unk_token_id is not None else 0)

    def _convert_id_to_token(self, index: int) -> str:
        data = self._bytes.get(index)
        return data.decode("latin-1") if data is not None else (self.unk_token or "")

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens).encode("latin-1", errors="replace").decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        import shutil

        target = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILE)
        if os.path.abspath(target) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, target)
        return (target,)


_CONTROL, _UNUSED = 3, 5  # gguf.TokenType


def gguf_tokenizer(path: Path, metadata: dict[str, Any]) -> RwkvWorldTokenizer:
    """The World tokenizer of an RWKV GGUF (tokenizer.ggml.model "rwkv"): llama.cpp's converter stores each token's
    bytes as the body of their Python bytes literal (unescaped here), `<s>` as control token 0 and padding past the
    vocabulary; its bos / eos / eot ids and chat template as the file states them. The vocabulary file is written
    to a temporary folder (the GGUF cache keeps a copy: save_vocabulary)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    lines, specials = [], {}
    for i, (text, kind) in enumerate(zip(tokens, types)):
        if kind == _CONTROL:
            specials[i] = text
        elif kind != _UNUSED:
            data = codecs.escape_decode(text.encode("utf-8"))[0]
            try:
                literal = repr(data.decode("utf-8"))
            except UnicodeDecodeError:
                literal = repr(data)
            lines.append(f"{i} {literal} {len(data)}\n")
    vocab = Path(tempfile.mkdtemp(prefix="lantern-rwkv-")) / VOCAB_FILE
    vocab.write_text("".join(lines), encoding="utf-8")

    from transformers import AddedToken

    named = {}
    for key in ("bos", "eos", "eot", "unk", "padding"):
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and 0 <= int(token_id) < len(tokens):
            named[key] = int(token_id)
    text_of = {
        i: specials.get(i) or codecs.escape_decode(tokens[i].encode("utf-8"))[0].decode("utf-8", "replace")
        for i in named.values()
    }
    tokenizer = RwkvWorldTokenizer(
        vocab_file=str(vocab),
        added_tokens_decoder={i: AddedToken(t, special=True, normalized=False) for i, t in specials.items()},
        bos_token=text_of.get(named.get("bos")),
        eos_token=text_of.get(named.get("eot", named.get("eos"))),
        unk_token=text_of.get(named.get("unk")),
        pad_token=text_of.get(named.get("padding")),
    )
    tokenizer.chat_template = metadata.get("tokenizer.chat_template")
    return tokenizer
