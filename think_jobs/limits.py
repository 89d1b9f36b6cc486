"""Input limits: how deep a JSON value may nest, how big a message and a submission may be,
how many parts and messages they may hold, and what a JSON value may contain.

Every entry (the Python API, HTTP, webhooks, the CLI, schedules, workflow steps) reaches
these checks through ``think_jobs.messages.coerce_messages`` and ``think_jobs.validation``
before anything is stored. Values are walked without recursion, so a list nested a million
levels deep costs a loop, not a crash, and each problem names the field, the limit and the
value (``messages[0].parts[1].data: nested 250 levels deep; the limit is 64``).

Why depth is limited at all: what is stored must read back. pydantic's JSON reader (the
conversation is read back in one pass) stops at 200 levels and its serializer near 250, so
``max_json_depth`` is capped at 128 (a stored message adds four levels around a part's data).
Integers are bounded too (``MAX_JSON_INTEGER``): one no JSON reader can hold, or Python
cannot print, is refused rather than stored. Text no one validated that a turn stores as its
error goes through ``storable_text`` (no NUL, no lone surrogate, at most ``ERROR_MAX_CHARS``).
This module is a leaf: it knows JSON values and paths, not messages.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:
    from think_jobs.settings import Settings

MAX_JSON_DEPTH_CAP = 128
ID_MAX_CHARS = 255  # ids and keys (message ids are stored in a VARCHAR(255) column)
REASON_MAX_CHARS = 2000  # a cancel's or an approval answer's reason (stored, shown to people)
REASON_PATTERN = r"^[^\x00]*$"  # PostgreSQL text cannot hold NUL
# A turn's error (an exception's message, a model's error chunk): stored, streamed and listed,
# so it is cut to this many characters, its last one "…" (``storable_text``).
ERROR_MAX_CHARS = 4000
# The largest integer a JSON value may hold, either sign: the largest 64-bit float (1.8e308, 309
# digits). JavaScript (the AI SDK), Rust's serde_json and most JSON readers read numbers as such
# floats: a larger one reads back as Infinity or fails, and Python will not print one of more
# than 4,300 digits at all. Integers past 2**53 are kept exactly here but read back rounded there.
MAX_JSON_INTEGER = int(sys.float_info.max)
# Regular expressions without look-arounds, so JSON Schema, Python and Rust read them alike.
# An id: printable ASCII without "/" (spaces only inside), and neither "." nor "..".
_VISIBLE, _NO_DOT, _ANY = r"[\x21-\x2e\x30-\x7e]", r"[\x21-\x2d\x30-\x7e]", r"[\x20-\x2e\x30-\x7e]"
IDENTIFIER_PATTERN = rf"^(?:{_NO_DOT}|{_NO_DOT}{_VISIBLE}|\.{_NO_DOT}|{_VISIBLE}{_ANY}+{_VISIBLE})$"
# A key (idempotency keys, webhook delivery ids, which travel in headers): the same, no spaces.
KEY_PATTERN = rf"^(?:{_NO_DOT}{_VISIBLE}*|\.(?:{_NO_DOT}{_VISIBLE}*|\.{_VISIBLE}+))$"
_SCALARS = (str, int, float, bool, type(None))
Key = str | int
Chain = tuple["Chain", Key] | None  # a path as a linked list: O(1) per node walked


@dataclass(frozen=True)
class Limits:
    """One set of limits (``Limits.of(settings)``); the defaults are the settings' defaults."""

    json_depth: int = 64
    message_bytes: int = 4 * 1024 * 1024
    submission_bytes: int = 16 * 1024 * 1024
    parts_per_message: int = 1000
    messages_per_submission: int = 100
    metadata_bytes: int = 16_384

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(
            json_depth=settings.max_json_depth,
            message_bytes=settings.max_message_bytes,
            submission_bytes=settings.max_submission_bytes,
            parts_per_message=settings.max_parts_per_message,
            messages_per_submission=settings.max_messages_per_submission,
            metadata_bytes=settings.max_metadata_bytes,
        )


DEFAULT_LIMITS = Limits()


def over_limit(where: str, measured: str, limit: int, setting: str) -> str:
    """``messages[0]: 5000000 bytes as JSON; the limit is 4194304 (THINK_JOBS_...)``."""
    return f"{where}: {measured}; the limit is {limit} (THINK_JOBS_{setting.upper()})"


def json_depth(value: object) -> int:
    """Nesting depth: 0 for a scalar, 1 for ``[]`` or ``{"a": 1}``, 2 for ``[[1]]``..."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        node, level = stack.pop()
        if _is_container(node):
            deepest = max(deepest, level + 1)
            stack.extend((child, level + 1) for _key, child in entries(node))
    return deepest


def value_problem(value: object, where: str, *, depth_limit: int) -> str | None:
    """Why ``value`` is not a JSON value within ``depth_limit`` levels (the first reason
    found, with the path to it), or None when it is one."""
    stack: list[tuple[object, Chain, int]] = [(value, None, 0)]
    while stack:
        node, chain, level = stack.pop()
        if _is_container(node):
            if level + 1 > depth_limit:
                deep = f"nested {json_depth(value)} levels deep"
                return over_limit(where, deep, depth_limit, "max_json_depth")
            children = list(entries(node))
            problem = _keys_problem(node, children, where, chain)
            if problem is not None:
                return problem
            stack.extend((child, (chain, key), level + 1) for key, child in reversed(children))
            continue
        problem = scalar_problem(node)
        if problem is not None:
            return f"{path_text(where, chain)}: {problem}"
    return None


def scalar_problem(node: object) -> str | None:
    """Why a leaf is not a JSON scalar that reads back as it was written, or None."""
    if isinstance(node, str):
        return None if is_unicode(node) else "text is not valid Unicode (a lone surrogate)"
    if isinstance(node, float) and not math.isfinite(node):
        return f"{node} is not a JSON number"
    if isinstance(node, int) and not -MAX_JSON_INTEGER <= node <= MAX_JSON_INTEGER:
        return integer_problem(node)
    if isinstance(node, _SCALARS):
        return None
    name = type(node).__name__
    return (
        f"a {name} is not JSON-serialisable (use objects, arrays, strings, numbers, booleans, null)"
    )


def integer_problem(number: int) -> str:
    """Why ``number`` is too large for JSON (it is not printed: it may have too many digits)."""
    digits = int(number.bit_length() * math.log10(2)) + 1
    return (
        f"an integer of about {digits} digits; JSON integers must be within "
        f"±{float(MAX_JSON_INTEGER):.3g} (what JavaScript and most JSON readers can hold)"
    )


def _keys_problem(
    node: object, children: list[tuple[Key, object]], where: str, chain: Chain
) -> str | None:
    if not isinstance(node, Mapping):
        return None
    for key, _child in children:
        if not isinstance(key, str):
            return f"{path_text(where, chain)}: object keys must be strings, got {key!r}"
        if not is_unicode(key):
            return f"{path_text(where, chain)}: a key is not valid Unicode (a lone surrogate)"
    return None


def has_control_characters(value: str) -> bool:
    """NUL and the other C0 controls, and DEL (PostgreSQL text cannot hold NUL)."""
    return any(ord(character) < 32 or ord(character) == 127 for character in value)


def is_unicode(text: str) -> bool:
    """False for text holding a lone surrogate (it can be neither encoded nor read back)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def well_formed(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, as a decoder does with ill-formed
    input (a surrogate pair held as two code points becomes its one character): text to stream
    and store, which must encode to UTF-8 and read back."""
    if is_unicode(text):
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def storable_text(text: str, max_chars: int = ERROR_MAX_CHARS) -> str:
    """``text`` as a turn stores, streams and lists it, whoever wrote it (an exception, a
    model's error chunk): each NUL (PostgreSQL text cannot hold one) and each lone surrogate
    becomes U+FFFD, and text longer than ``max_chars`` is cut to that many characters, the last
    one "…" to show where. Only the text up to the cap is looked at (a message of megabytes
    costs no more than a short one)."""
    head = text[: max_chars + 1]
    if len(text) > max_chars and "\ud800" <= head[-1] <= "\udbff":
        head = head[:-1]  # the first half of a pair whose second half is cut off
    cleaned = well_formed(head).replace("\x00", "\ufffd")
    if len(text) <= max_chars:
        return cleaned
    return cleaned[: max_chars - 1] + "…"


def _is_container(node: object) -> bool:
    """JSON objects and arrays; a pydantic model inside a value is not JSON (refused)."""
    return isinstance(node, Mapping | list | tuple)


def entries(node: object) -> Iterator[tuple[Key, object]]:
    """The children of a container: a mapping's items, a sequence's items with their index,
    a pydantic model's set fields by wire name (so a ``UIMessage`` walks like its JSON)."""
    if isinstance(node, Mapping):
        yield from node.items()
    elif isinstance(node, list | tuple):
        yield from enumerate(node)
    elif isinstance(node, BaseModel):
        for name, field in type(node).model_fields.items():
            child = getattr(node, name)
            if child is not None:
                yield field.alias or name, child


def path_text(where: str, chain: Chain) -> str:
    """``path_text("messages[0].metadata", ((None, "a"), 3))`` → ``messages[0].metadata.a[3]``."""
    keys: list[Key] = []
    while chain is not None:
        chain, key = chain
        keys.append(key)
    out = where
    for key in reversed(keys):
        out += f"[{key}]" if isinstance(key, int) else f".{key}"
    return out
