"""Finding things in JSON text without parsing all of it: the elements of a top-level array,
and the ``id`` an object starts with.

Used where JSON could not be read back (a stored message nested past the reader's limit, a
row edited by hand), to name the element at fault. Nothing here recurses, so text nested a
million levels deep is scanned, not parsed. A leaf module: standard library only.
"""

from __future__ import annotations

import json
import re

_TOKENS = re.compile(r'"(?:[^"\\]++|\\.)*+"|[\[\]{},]')
_LEADING_ID = re.compile(r'\s*\{\s*"id"\s*:\s*("(?:[^"\\]++|\\.)*+")')


def array_elements(text: str) -> list[str]:
    """The elements of the JSON array ``text`` as text (split at its top-level commas)."""
    depth, start, found = 0, 0, []
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token[0] == '"':
            continue
        if token in "[{":
            depth += 1
            start = match.end() if depth == 1 else start
        elif token in "]}":
            depth -= 1
            if depth == 0:
                found.append(text[start : match.start()])
        elif depth == 1:
            found.append(text[start : match.start()])
            start = match.end()
    return [item for item in found if item.strip()]


def leading_id(text: str) -> str | None:
    """The string ``id`` of the JSON object ``text``, even when the rest cannot be parsed."""
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):
        return _scanned_id(text)
    value = found.get("id") if isinstance(found, dict) else None
    return value if isinstance(value, str) else None


def _scanned_id(text: str) -> str | None:
    match = _LEADING_ID.match(text)
    if match is None:
        return None
    try:
        value = json.loads(match.group(1))
    except ValueError:
        return None
    return value if isinstance(value, str) else None
