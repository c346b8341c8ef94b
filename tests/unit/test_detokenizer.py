"""Incremental detokenization equals a full decode, for byte-level BPE and SentencePiece-style spaces."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lantern.app.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher

TEXTS = [
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \U0001f600\U0001f680 done",
    "\u4f60\u597d\uff0c\u4e16\u754c\u3002 \u3053\u3093\u306b\u3061\u306f",
    "  leading spaces and\ttabs\nnew lines  ",
    "def add(a, b):\n    return a + b",
]


def byte_level_tokenizer(tmp_path):
    from tests.fixtures.tiny_models import build_tokenizer

    return build_tokenizer(tmp_path)


def metaspace_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "</s>"] + byte_tokens)
    tok.train_from_iterator(TEXTS * 3, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")


@pytest.mark.parametrize("kind", ["byte_level", "metaspace"])
def test_incremental_text_equals_full_decode(tmp_path, kind):
    tok = byte_level_tokenizer(tmp_path) if kind == "byte_level" else metaspace_tokenizer()
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        for split in (1, len(ids) // 2):
            prompt, gen = ids[:split], ids[split:]
            detok = IncrementalDetokenizer(tok, prompt)
            pieces = [detok.add(t) for t in gen]
            expected = tok.decode(ids)[len(tok.decode(prompt)) :]
            assert "".join(pieces) == expected == detok.text
            assert all("\ufffd" not in p for p in pieces)


def test_stop_string_across_tokens_and_hold_back():
    m = StopStringMatcher(["STOP", "xy"])
    assert m.check("hello ST", 2) == (None, 6)  # "ST" might begin STOP: hold it back
    assert m.check("hello STO", 1) == (None, 6)
    assert m.check("hello STOP now", 5) == ("STOP", 6)
    assert m.check("ab x", 1) == (None, 3)
    assert m.check("axy", 1) == ("xy", 1)
    assert StopStringMatcher(["STOP"], include_stop=True).check("a STOP", 2) == ("STOP", 6)
    assert StopStringMatcher([]).check("anything", 3) == (None, 8)


def _reference_check(stops: list[str], text: str, new_len: int, floor: int, include: bool):
    """Brute force: earliest stop starting at or after the search window; else the longest
    suffix (not reaching into `floor`) that is a proper prefix of a stop."""
    max_len = max(len(s) for s in stops)
    lo = max(len(text) - new_len - max_len + 1, floor, 0)
    hits = [(i, s) for s in stops for i in range(lo, len(text) - len(s) + 1) if text.startswith(s, i)]
    if hits:
        i = min(h[0] for h in hits)
        first = next(s for s in stops if text.startswith(s, i))  # the first stop listed that matches there
        return first, i + len(first) if include else i
    hold = max(
        (k for s in stops for k in range(1, len(s)) if k <= len(text) - floor and text.endswith(s[:k])), default=0
    )
    return None, len(text) - hold


@settings(max_examples=400, deadline=None)
@given(
    stops=st.lists(st.text("ab c", min_size=1, max_size=6), min_size=1, max_size=4),
    text=st.text("ab c", max_size=30),
    new=st.integers(0, 30),
    floor=st.integers(0, 30),
    include=st.booleans(),
)
def test_stop_matcher_equals_a_brute_force_reference(stops, text, new, floor, include):
    new, floor = min(new, len(text)), min(floor, len(text))
    assert StopStringMatcher(stops, include).check(text, new, floor) == _reference_check(
        stops, text, new, floor, include
    )
