"""Kept importable for older imports: the reasoning parser lives in the engine
(lantern.app.engine.reasoning), where the terminal chat uses it without the server."""

from lantern.app.engine.reasoning import (
    CHOICES,
    NAMES,
    THINK_END,
    THINK_START,
    ReasoningParser,
    detect,
    markers_are_special,
    prompt_opens_reasoning,
    prompt_state,
)

__all__ = [
    "CHOICES",
    "NAMES",
    "THINK_END",
    "THINK_START",
    "ReasoningParser",
    "detect",
    "markers_are_special",
    "prompt_opens_reasoning",
    "prompt_state",
]
