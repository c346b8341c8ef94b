"""Chat messages -> prompt token ids through the model's chat template.

Only the template may produce role markup. Text a caller sends (message content, names, template
kwargs) that spells a special token such as `<|im_end|>` is tokenized as plain text, so nobody can
forge a system or assistant turn by typing the markup.

How: the common case (no caller string contains special-token text) is the plain path, render then
encode. Otherwise the template is rendered a second time with a unique placeholder in place of
each such string; substituting the strings back must give the real render exactly (else the
template transformed them and we refuse rather than guess). That locates every caller span in
the rendered text. The plain encoding (with offsets) is then kept as is, except that each stretch
between two template-made special tokens which holds a special token overlapping a caller span is
re-encoded with special tokens read as text. Everything else is token-for-token the plain path.
"""

from __future__ import annotations

import json
import re
import secrets
import weakref
from dataclasses import dataclass
from typing import Any

from lantern.app.engine.errors import InvalidRequestError

_TEMPLATE_ERRORS: tuple[type[BaseException], ...] = (TypeError, ValueError, KeyError, IndexError, AttributeError)
try:  # jinja2 comes with transformers; its errors are what a broken template or bad message raises
    import jinja2

    _TEMPLATE_ERRORS = (jinja2.TemplateError, *_TEMPLATE_ERRORS)
except ImportError:  # pragma: no cover
    pass


@dataclass
class _Specials:
    pattern: re.Pattern[str] | None  # any special token's text; None when the tokenizer has none
    ids: frozenset[int]
    markup_ids: frozenset[int]  # ids minus <unk>, which plain text with unknown characters produces too
    normalize: Any  # str -> str, the tokenizer's normalizer when special tokens match after it
    backend: Any  # the tokenizer's tokenizers.Tokenizer, or None (a slow tokenizer)
    _readers: tuple[Any, Any] | None = None

    def readers(self) -> tuple[Any, Any] | None:
        """Private copies of the backend that read special tokens as text: (for the start of the
        input, for text after it). Built on first use (~0.5 s for a 49k vocabulary), not per call.
        Copies, never the shared tokenizer's flag: transformers flips `encode_special_tokens` on the
        shared backend per call, which would race with other threads encoding."""
        if self._readers is None and self.backend is not None:
            from tokenizers import Tokenizer

            first = Tokenizer.from_str(self.backend.to_str())
            inner = Tokenizer.from_str(_not_first(self.backend.to_str()))
            first.encode_special_tokens = inner.encode_special_tokens = True
            self._readers = (first, inner)
        return self._readers


_cache: weakref.WeakKeyDictionary[Any, _Specials] = weakref.WeakKeyDictionary()


def _specials(tokenizer: Any) -> _Specials:
    try:
        return _cache[tokenizer]
    except (KeyError, TypeError):
        pass
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = {i: t for i, t in added.items() if getattr(t, "special", True)}
    texts = sorted({str(getattr(t, "content", t)) for t in special.values()}, key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, texts))) if texts else None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    normalize = None
    if (
        backend is not None
        and backend.normalizer is not None
        and any(getattr(t, "normalized", False) for t in special.values())
    ):
        normalize = backend.normalizer.normalize_str
    unk = getattr(tokenizer, "unk_token_id", None)
    found = _Specials(pattern, frozenset(special), frozenset(special) - {unk}, normalize, backend)
    try:
        _cache[tokenizer] = found
    except TypeError:
        pass
    return found


def _not_first(tokenizer_json: str) -> str:
    """The tokenizer as it reads text that does not start the input.

    A stretch re-encoded after a template-made special token does not start the rendered text,
    but a tokenizer encoding it alone would treat it as the start: Metaspace with
    prepend_scheme "first" (Mistral, non-legacy Llama 2) would add a "▁" the plain encoding does
    not have. "never" is what it does past the start.
    """
    spec = json.loads(tokenizer_json)
    pre = spec.get("pre_tokenizer") or {}
    for p in [pre, *(pre.get("pretokenizers") or [])]:
        if p.get("type") == "Metaspace" and p.get("prepend_scheme") == "first":
            p["prepend_scheme"] = "never"
    return json.dumps(spec)


def _special_in(value: Any, sp: _Specials) -> str | None:
    """The first special-token text inside any string of `value` (nested dicts/lists), or None."""
    if sp.pattern is None:
        return None
    if isinstance(value, str):
        m = sp.pattern.search(value) or (sp.normalize and sp.pattern.search(sp.normalize(value)))
        return m.group(0) if m else None
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return None
    for item in items:
        hit = _special_in(item, sp)
        if hit:
            return hit
    return None


def _render(tokenizer: Any, template: str, messages: Any, add_generation_prompt: bool, kwargs: dict) -> str:
    try:
        text = tokenizer.apply_chat_template(
            messages, chat_template=template, add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
        )
    except _TEMPLATE_ERRORS as exc:
        raise InvalidRequestError(
            f"the chat template could not render these messages: {exc}", param="messages"
        ) from None
    if not isinstance(text, str):
        raise InvalidRequestError("the chat template did not render to text", param="messages")
    return text


def encode_chat(
    tokenizer: Any,
    template: str | None,
    messages: list[dict],
    add_generation_prompt: bool = True,
    **template_kwargs: Any,
) -> list[int]:
    """Render `messages` with `template` and tokenize. The template already holds any BOS/special
    tokens the model expects, so none are added a second time; special-token text inside caller
    strings stays text. Raises InvalidRequestError(param="messages") when it cannot do that."""
    if not template:
        raise InvalidRequestError("this model has no chat template; give one with --chat-template", param="messages")
    text = _render(tokenizer, template, messages, add_generation_prompt, template_kwargs)
    sp = _specials(tokenizer)
    found = _special_in(messages, sp) or _special_in(template_kwargs, sp)
    if found is None:
        return list(tokenizer.encode(text, add_special_tokens=False))
    return _encode_escaped(tokenizer, template, messages, add_generation_prompt, template_kwargs, text, sp, found)


def _refuse(token: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"a message contains the special token {token!r}, which this model's chat template and tokenizer "
        "cannot keep as plain text (the template rewrites message text); remove it from the message",
        param="messages",
    )


def _caller_spans(
    tokenizer: Any, template: str, messages: Any, add_generation_prompt: bool, kwargs: dict, text: str, sp: _Specials
) -> list[tuple[int, int]] | None:
    """Where the caller strings that hold special-token text sit in `text`; None if the template
    does not reproduce them verbatim."""
    nonce = secrets.token_hex(6)
    originals: dict[str, str] = {}

    def swap(value: Any) -> Any:
        if isinstance(value, str):
            if _special_in(value, sp) is None:
                return value
            # Private-use brackets and hex survive trim/escaping filters and never occur by chance.
            key = f"\ue000{nonce}{len(originals)}\ue001"
            originals[key] = value
            return key
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [swap(v) for v in value]
        return value

    marked = _render(tokenizer, template, swap(messages), add_generation_prompt, swap(kwargs))
    if not originals:
        return [] if marked == text else None
    split = re.compile("|".join(map(re.escape, originals)))
    spans: list[tuple[int, int]] = []
    rebuilt: list[str] = []
    pos = last = 0
    for m in split.finditer(marked):
        piece = marked[last : m.start()]
        rebuilt.append(piece)
        pos += len(piece)
        value = originals[m.group(0)]
        rebuilt.append(value)
        spans.append((pos, pos + len(value)))
        pos += len(value)
        last = m.end()
    rebuilt.append(marked[last:])
    return spans if "".join(rebuilt) == text else None


def _encode_escaped(
    tokenizer: Any,
    template: str,
    messages: Any,
    add_generation_prompt: bool,
    kwargs: dict,
    text: str,
    sp: _Specials,
    found: str,
) -> list[int]:
    spans = _caller_spans(tokenizer, template, messages, add_generation_prompt, kwargs, text, sp)
    readers = sp.readers() if spans is not None else None
    if spans is None or readers is None:
        raise _refuse(found)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = list(enc["input_ids"])
    offsets: list[tuple[int, int]] = [tuple(o) for o in enc["offset_mapping"]]

    def in_caller_text(start: int, end: int) -> bool:
        return any(start < e and s < end for s, e in spans)

    # Template-made special tokens are anchors; the plain encoding never merges across them.
    anchors = [i for i, t in enumerate(ids) if t in sp.ids and not in_caller_text(*offsets[i])]
    out: list[int] = []
    prev_i, prev_end = -1, 0
    for a in [*anchors, len(ids)]:
        stretch = ids[prev_i + 1 : a]
        end = offsets[a][0] if a < len(ids) else len(text)
        if any(t in sp.ids for t in stretch):  # a special token made of caller text: re-read as text
            reader = readers[0] if prev_end == 0 else readers[1]
            stretch = reader.encode(text[prev_end:end], add_special_tokens=False).ids
            if any(t in sp.markup_ids for t in stretch):  # pragma: no cover - a tokenizer ignoring the flag
                raise _refuse(found)
        out.extend(stretch)
        if a < len(ids):
            out.append(ids[a])
            prev_i, prev_end = a, offsets[a][1]
    return out
