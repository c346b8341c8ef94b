"""Chat messages -> prompt token ids through the model's chat template."""
from __future__ import annotations

from typing import Any


def encode_chat(tokenizer: Any, template: str | None, messages: list[dict], add_generation_prompt: bool = True,
                **template_kwargs: Any) -> list[int]:
    """Render `messages` with `template` and tokenize; the template already holds any BOS/special
    tokens the model expects, so none are added a second time."""
    if not template:
        raise ValueError("this model has no chat template; pass one with chat_template=")
    text = tokenizer.apply_chat_template(messages, chat_template=template, add_generation_prompt=add_generation_prompt,
                                         tokenize=False, **template_kwargs)
    return tokenizer.encode(text, add_special_tokens=False)
