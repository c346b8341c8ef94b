"""RWKV's World tokenizer (RWKV-7 folders' RwkvTokenizer, remote code Lantern does not run): read from the folder's
rwkv_vocab_v20230424.txt and tokenizer_config.json by app/models/rwkv_tokenizer.py, held to BlinkDL's own
TRIE_TOKENIZER (the `rwkv` package's, with the same vocabulary file) on text of many scripts and on random text; its
special tokens and chat template as the folder states them; an RWKV-7 folder with it served on both backends."""

from __future__ import annotations

import random

import pytest

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.loader import _folder_tokenizer
from lantern.app.models.rwkv_tokenizer import VOCAB_FILE, RwkvWorldTokenizer
from tests.fixtures.rwkv_world import END, official_vocab, write_tokenizer
from tests.models.test_rwkv7 import rwkv7_folder

TEXTS = [
    "Hello world",
    "Today is a beautiful day. 今天是美好的一天。",
    "  leading spaces,\ttabs\nand\n\nblank lines\n\n\n",
    "def f(x):\n    return x ** 2  # squares\n",
    "Ünïcödé: ñ, ß, é; Ελληνικά; русский; العربية; हिन्दी; 한국어; 日本語のテキスト",
    "emoji 🙂👍🏽🚀 and symbols ∑∫√ ≤ ≥ ≠",
    "",
]


def _reference(vocab=None):
    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER

    return TRIE_TOKENIZER(str(vocab or official_vocab()))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    tok = _folder_tokenizer(write_tokenizer(tmp_path_factory.mktemp("rwkv_tok")))
    assert isinstance(tok, RwkvWorldTokenizer)
    return tok


def _random_texts(n: int) -> list[str]:
    rng = random.Random(7)
    pools = ["abcdefghijklmnopqrstuvwxyz ", "ABC xyz 0123456789 .,;:!?\n\t", "的一是不了人我在有他这", "αβγδ жзий ñé"]
    pools.append("🙂🚀👍🏽∑√")
    return ["".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 120))) for _ in range(n)]


def test_ids_are_blinkdls_trie_tokenizers(tokenizer):
    trie = _reference()
    for text in TEXTS + _random_texts(200):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == trie.encode(text), repr(text)
        assert tokenizer.decode(ids) == text


def test_tokens_that_split_a_character_decode_together(tokenizer):
    ids = tokenizer.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1  # (the emoji's four bytes are not one token of this vocabulary)
    assert tokenizer.decode(ids) == "🙂" and "\ufffd" in tokenizer.decode(ids[:1])


def test_special_tokens_and_chat_template(tokenizer):
    assert tokenizer.convert_tokens_to_ids(END) == 0 == tokenizer.eos_token_id
    assert tokenizer.encode(f"Hi{END}there", add_special_tokens=False) == [
        *_reference().encode("Hi"),
        0,
        *_reference().encode("there"),
    ]
    assert tokenizer.decode([0, *tokenizer.encode("x", add_special_tokens=False)], skip_special_tokens=True) == "x"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == f"{END}User: Hi\n\nAssistant:"


def test_special_tokens_of_any_script_are_the_vocabularys_own(tmp_path):
    """A special token stated by its text ("✿": bytes e2 9c bf in the vocabulary) takes the vocabulary's id, not a
    new one; an added token past the vocabulary takes an id past every vocabulary id; both decode as their text."""
    import json

    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER

    folder = write_tokenizer(tmp_path / "tok")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config |= {"eos_token": "✿", "additional_special_tokens": ["<|im_start|>"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "special_tokens_map.json").unlink()
    tok = _folder_tokenizer(folder)
    flower = TRIE_TOKENIZER(str(official_vocab())).encode("✿")
    assert len(flower) == 1 and tok.eos_token_id == flower[0]
    start = tok.convert_tokens_to_ids("<|im_start|>")
    assert start >= 65530 and start != flower[0]
    ids = tok.encode("a✿é<|im_start|>b", add_special_tokens=False)
    assert start in ids and tok.decode(ids) == "a✿é<|im_start|>b"


def test_a_new_token_takes_an_id_past_the_vocabulary(tmp_path):
    """A cut vocabulary (ids 1 to 300) with no end-of-text token at 0: a special token it lacks takes an id past 300
    (transformers numbers new tokens by the vocabulary's size), not the last token's."""
    import json

    folder = write_tokenizer(tmp_path / "tok", lines=300)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("added_tokens_decoder")
    config |= {"bos_token": None, "unk_token": None, "pad_token": None, "eos_token": "<|x|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "special_tokens_map.json").unlink()
    tok = _folder_tokenizer(folder)
    assert tok.eos_token_id > 300 and tok.decode([300]) != "<|x|>"
    assert tok.decode([tok.eos_token_id]) == "<|x|>"


def test_rwkv7_folder_with_the_world_tokenizer_serves(tmp_path, backend):
    """A tiny RWKV-7 with the World vocabulary (cut to its first 2000 tokens) answers a chat through it."""
    folder = rwkv7_folder(tmp_path / "m", world=2000)
    llm = LLM(str(folder), backend=backend, dtype="float32", num_kv_blocks=64)
    try:
        assert isinstance(llm.tokenizer, RwkvWorldTokenizer)
        reference = _reference(folder / VOCAB_FILE)
        assert llm.tokenizer.encode("Today is a day", add_special_tokens=False) == reference.encode("Today is a day")
        out = llm.chat(
            [{"role": "user", "content": "Hi"}], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        )
        assert len(out[0].outputs[0].token_ids) == 6
        # (random weights pick any bytes: the reference's bytes, invalid UTF-8 replaced as the server streams it)
        expected = reference.decodeBytes(out[0].outputs[0].token_ids).decode("utf-8", errors="replace")
        assert out[0].outputs[0].text == expected
    finally:
        llm.engine.shutdown()


def test_constrained_decoding_reads_the_world_tokens(tmp_path, backend):
    """Structured output (a regex, a JSON schema) with RWKV's World tokenizer: its masks are built from each id's
    bytes, so the random tiny model's output still matches exactly."""
    import json
    import re

    from lantern.app.engine.sampling_params import StructuredSpec

    folder = rwkv7_folder(tmp_path / "m", world=2000)
    llm = LLM(str(folder), backend=backend, dtype="float32", num_kv_blocks=64)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    schema["additionalProperties"] = False  # (bounded: a random model would write digits until max_tokens)
    try:
        regex = SamplingParams(
            temperature=1.0,
            max_tokens=24,
            seed=3,
            structured=StructuredSpec("regex", "[a-z]{3,8} [0-9]{2}", param="response_format"),
        )
        text = llm.generate(["Today"], regex)[0].outputs[0].text
        assert re.fullmatch("[a-z]{3,8} [0-9]{2}", text), text
        shaped = SamplingParams(
            temperature=1.0,
            max_tokens=48,
            seed=5,
            structured=StructuredSpec("json_schema", schema, param="response_format", whitespace=""),
        )
        value = json.loads(llm.generate(["Today"], shaped)[0].outputs[0].text)
        assert isinstance(value["ok"], bool) and set(value) == {"ok"}
    finally:
        llm.engine.shutdown()
