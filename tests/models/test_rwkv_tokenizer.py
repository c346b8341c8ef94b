"""RWKV's World tokenizer (RWKV-7 folders' RwkvTokenizer, remote code Lantern does not run): read from the folder's
rwkv_vocab_v20230424.txt and tokenizer_config.json by app/models/rwkv_tokenizer.py, held to BlinkDL's own
TRIE_TOKENIZER (the `rwkv` package's, with the same vocabulary file) on text of many scripts and on random text; its
special tokens and chat template as the folder states them; an RWKV-7 folder with it served on both backends."""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import pytest

from lantern.app.engine import LLM, SamplingParams
from lantern.app.models.loader import _folder_tokenizer
from lantern.app.models.rwkv_tokenizer import VOCAB_FILE, RwkvWorldTokenizer
from tests.models.test_rwkv7 import rwkv7_folder

END = "<|rwkv_tokenizer_end_of_text|>"
TEMPLATE = (
    "{{ '" + END + "' }}{% for m in messages %}{% if m['role'] == 'user' %}{{ 'User: ' + m['content'] + '\\n\\n' }}"
    "{% else %}{{ 'Assistant: ' + m['content'] + '\\n\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
TEXTS = [
    "Hello world",
    "Today is a beautiful day. 今天是美好的一天。",
    "  leading spaces,\ttabs\nand\n\nblank lines\n\n\n",
    "def f(x):\n    return x ** 2  # squares\n",
    "Ünïcödé: ñ, ß, é; Ελληνικά; русский; العربية; हिन्दी; 한국어; 日本語のテキスト",
    "emoji 🙂👍🏽🚀 and symbols ∑∫√ ≤ ≥ ≠",
    "",
]


def _reference():
    import rwkv
    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER

    return TRIE_TOKENIZER(os.path.join(os.path.dirname(rwkv.__file__), VOCAB_FILE))


def write_tokenizer(out):
    """The tokenizer files of an RWKV-7 folder (flash-linear-attention's conversion): the official vocabulary file,
    the remote class named in tokenizer_config.json with its end-of-text token 0 and a chat template."""
    import rwkv

    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out / name).unlink(missing_ok=True)
    shutil.copy(os.path.join(os.path.dirname(rwkv.__file__), VOCAB_FILE), out / VOCAB_FILE)
    specials = {"bos_token": END, "eos_token": END, "unk_token": END, "pad_token": END}
    config = {
        "tokenizer_class": "RwkvTokenizer",
        "auto_map": {"AutoTokenizer": ["hf_rwkv_tokenizer.RwkvTokenizer", None]},
        "added_tokens_decoder": {"0": {"content": END, "special": True}},
        "chat_template": TEMPLATE,
        "use_fast": False,
        **specials,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "special_tokens_map.json").write_text(json.dumps(specials))
    return out


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


def test_rwkv7_folder_with_the_world_tokenizer_serves(tmp_path, backend):
    """A tiny RWKV-7 with the World vocabulary (65536 rows) answers a chat through it."""
    from safetensors.numpy import load_file, save_file

    folder = rwkv7_folder(tmp_path / "m")
    tensors = load_file(str(folder / "model.safetensors"))
    rng = np.random.default_rng(1)
    for name in ("model.embeddings.weight", "lm_head.weight"):
        tensors[name] = (rng.standard_normal((65536, tensors[name].shape[1])) * 0.3).astype(np.float32)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text()) | {"vocab_size": 65536, "bos_token_id": 0, "eos_token_id": 0}
    (folder / "config.json").write_text(json.dumps(cfg))
    write_tokenizer(folder)
    llm = LLM(str(folder), backend=backend, dtype="float32", num_kv_blocks=64)
    try:
        assert isinstance(llm.tokenizer, RwkvWorldTokenizer)
        assert llm.tokenizer.encode("Today is a day", add_special_tokens=False) == _reference().encode("Today is a day")
        out = llm.chat(
            [{"role": "user", "content": "Hi"}], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        )
        assert len(out[0].outputs[0].token_ids) == 6 and isinstance(out[0].outputs[0].text, str)
    finally:
        llm.engine.shutdown()
