"""OpenAI chat-completions fields beyond sampling, decided one by one (the official SDK's
completion_create_params is the list audited): honoured, accepted as having no effect on the
answer by OpenAI's own definition, or refused with a 400 naming the field.

- Honoured: `reasoning_effort` (and /v1/responses' `reasoning.effort`) reaches the chat template:
  as `reasoning_effort` where the template reads it (gpt-oss, as vLLM passes it), else as
  `enable_thinking` on/off where the template reads that (Qwen3: "none"/"minimal" switch thinking
  off, any other effort on); refused where the template reads neither, since nothing would change.
- Accepted, no effect on the answer: `user`, `safety_identifier` (identifiers for OpenAI's abuse
  monitoring), `prompt_cache_key`, `prompt_cache_retention`, `prompt_cache_options` (cache hints:
  the prefix cache matches prefixes without them), `metadata` (tags on a stored object; checked
  against OpenAI's limits), `store` (keeps the completion for OpenAI's distillation and evals
  products, which a local server does not have), `prediction` (a predicted output only speeds a
  response up, it never changes it: accepting it is honouring it), `modalities` ["text"],
  `service_tier` "auto"/"default" (this server has one tier).
- Refused: `modalities` with "audio" and `audio` (no audio output), `web_search_options` (a
  built-in tool), `verbosity` (the length of an answer cannot be steered), `moderation` (no
  moderation model), `service_tier` flex/scale/priority/fast (one tier: a price or latency class
  asked for would not be given).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from lantern.app.engine import InvalidRequestError

logger = logging.getLogger(__name__)

# The SDK's ReasoningEffort literal (openai/types/shared/reasoning_effort.py).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_THINKING_OFF = {"none", "minimal"}
_METADATA_KEYS, _METADATA_KEY_LEN, _METADATA_VALUE_LEN = 16, 64, 512
_TIERS = {"auto", "default"}


def _refuse(param: str, why: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param} {why}", param=param)


def check_metadata(metadata: dict[str, Any] | None) -> None:
    """OpenAI's limits on metadata: 16 pairs, string keys of 64 and values of 512 characters."""
    if metadata is None:
        return
    if len(metadata) > _METADATA_KEYS:
        raise _refuse("metadata", f"holds at most {_METADATA_KEYS} key-value pairs")
    for key, value in metadata.items():
        if len(key) > _METADATA_KEY_LEN:
            raise _refuse("metadata", f"keys are at most {_METADATA_KEY_LEN} characters ({key[:16]!r}...)")
        if not isinstance(value, str) or len(value) > _METADATA_VALUE_LEN:
            raise _refuse("metadata", f"value of {key!r} must be a string of at most {_METADATA_VALUE_LEN} characters")


def _check_prediction(prediction: Any) -> None:
    if not isinstance(prediction, dict) or prediction.get("type") != "content":
        raise _refuse("prediction", 'must be {"type": "content", "content": ...}')
    content = prediction.get("content")
    parts_ok = isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    )
    if not isinstance(content, str) and not parts_ok:
        raise _refuse("prediction.content", "must be a string or a list of text parts")


def refuse_unhonoured(body: Any) -> None:
    """400 naming the first chat field whose value would change the answer and cannot be
    honoured; the harmless ones are checked for shape only. `body` is a ChatCompletionRequest."""
    if body.modalities is not None and any(m != "text" for m in body.modalities):
        raise _refuse("modalities", 'may only be ["text"]: this server does not generate audio')
    if body.audio is not None:
        raise _refuse("audio", "is not supported: this server does not generate audio")
    if body.web_search_options is not None:
        raise _refuse("web_search_options", "is not supported: this server has no web search tool")
    if body.verbosity is not None:
        raise _refuse("verbosity", "is not supported: the length of the answer cannot be steered")
    if body.moderation is not None:
        raise _refuse("moderation", "is not supported: this server runs no moderation model")
    if body.service_tier is not None and body.service_tier not in _TIERS:
        raise _refuse("service_tier", 'must be "auto" or "default": this server has one tier')
    check_metadata(body.metadata)
    if body.prediction is not None:
        _check_prediction(body.prediction)


def effort_template_kwargs(
    template: str | None, effort: str | None, user_kwargs: dict[str, Any] | None, param: str = "reasoning_effort"
) -> dict[str, Any] | None:
    """The chat template's kwargs with the reasoning effort in the name the template reads.
    A template that reads neither `reasoning_effort` nor `enable_thinking` would render the same
    prompt whatever the effort: refused rather than ignored. A chat_template_kwargs value that
    contradicts the effort is refused too (two answers to one question)."""
    if effort is None:
        return user_kwargs
    kwargs = dict(user_kwargs or {})
    text = template or ""
    if "reasoning_effort" in text:
        wanted: dict[str, Any] = {"reasoning_effort": effort}
    elif "enable_thinking" in text:
        wanted = {"enable_thinking": effort not in _THINKING_OFF}
    else:
        raise _refuse(param, "cannot be honoured: this model's chat template reads no reasoning effort")
    for key, value in wanted.items():
        if key in kwargs and kwargs[key] != value:
            raise _refuse(param, f"contradicts chat_template_kwargs.{key} ({kwargs[key]!r})")
        kwargs[key] = value
    logger.debug("%s %r -> template kwargs %s", param, effort, wanted)
    return kwargs
