"""The input limits at the core's edge (issue 15): depth, sizes, counts, what a JSON value may
hold, the id rule, and naming the message that cannot be read back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from think_jobs.errors import InvalidInputError, MessageValidationError, StoredMessageError
from think_jobs.json_text import array_elements, leading_id
from think_jobs.limits import (
    DEFAULT_LIMITS,
    ERROR_MAX_CHARS,
    MAX_JSON_INTEGER,
    Limits,
    json_depth,
    scalar_problem,
    storable_text,
    value_problem,
    well_formed,
)
from think_jobs.messages import (
    UIMessage,
    coerce_message,
    coerce_messages,
    stored_messages,
    user_text_message,
)
from think_jobs.settings import Settings
from think_jobs.validation import agent_name, identifier, json_object, key


def nested(levels: int) -> Any:
    """``[[...[1]...]]``: a list nested ``levels`` deep."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def data_message(data: Any, message_id: str = "m-1") -> dict[str, Any]:
    parts = [{"type": "text", "text": "x"}, {"type": "data-x", "data": data}]
    return {"id": message_id, "role": "user", "parts": parts}


def refusal(*messages: Any, limits: Limits = DEFAULT_LIMITS) -> str:
    with pytest.raises(MessageValidationError) as caught:
        coerce_messages(list(messages), limits=limits)
    return str(caught.value)


# -- depth -------------------------------------------------------------------------------------


def test_the_618_byte_message_is_refused_naming_field_depth_and_limit() -> None:
    """Issue 15, case 1: 250 levels in a data part passed the edge and bricked the agent."""
    message = data_message(nested(250))
    assert len(json.dumps(message)) < 700
    assert refusal(message).startswith(
        "messages[0].parts[1].data: nested 250 levels deep; the limit is 64"
    )


@pytest.mark.parametrize("levels", [255, 1000, 100_000])
def test_any_depth_is_refused_without_crashing(levels: int) -> None:
    assert f"nested {levels} levels deep" in refusal(data_message(nested(levels)))


def test_depth_is_counted_per_field_with_the_limit_itself_allowed() -> None:
    limits = Limits(json_depth=3)
    assert coerce_message(data_message(nested(3)), limits=limits).parts[1]
    tool = {"type": "tool-t", "toolCallId": "c", "state": "output-available"}
    message = {
        "id": "m",
        "role": "assistant",
        "metadata": {"a": {"b": {"c": {}}}},
        "parts": [{**tool, "input": nested(4), "output": nested(2)}],
    }
    text = refusal(message, limits=limits)
    assert "messages[0].metadata: nested 4 levels deep; the limit is 3" in text
    assert "messages[0].parts[0].input: nested 4 levels deep; the limit is 3" in text
    assert "output" not in text


def test_a_uimessage_object_is_checked_like_a_dict() -> None:
    message = UIMessage.model_validate(data_message(nested(100)))
    assert "messages[0].parts[1].data: nested 100 levels deep" in refusal(message)


def test_json_depth_counts_containers() -> None:
    values: tuple[object, ...] = (1, [], {}, [[1]], {"a": [{}]}, nested(7))
    assert [json_depth(v) for v in values] == [0, 1, 1, 2, 3, 7]


# -- what a JSON value may hold ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ("a\ud800b", "parts[1].data: text is not valid Unicode"),
        ({"k\udfff": 1}, "parts[1].data: a key is not valid Unicode"),
        ({"a": [1, float("nan")]}, "parts[1].data.a[1]: nan is not a JSON number"),
        ([float("inf")], "parts[1].data[0]: inf is not a JSON number"),
        ({1: "x"}, "parts[1].data: object keys must be strings, got 1"),
        ({"s": {1, 2}}, "parts[1].data.s: a set is not JSON-serialisable"),
    ],
)
def test_values_that_would_not_read_back_are_refused(data: Any, fragment: str) -> None:
    assert fragment in refusal(data_message(data))


def test_a_lone_surrogate_in_text_is_refused() -> None:
    """It serialises as ``\\ud800``, which pydantic's JSON reader then refuses for ever."""
    message = {"id": "m", "role": "user", "parts": [{"type": "text", "text": "\ud800"}]}
    assert "messages[0].parts[0].text: text is not valid Unicode" in refusal(message)


# -- sizes and counts --------------------------------------------------------------------------


def test_message_bytes_parts_and_messages_are_bounded() -> None:
    limits = Limits(message_bytes=2000, submission_bytes=3000, parts_per_message=3)
    big = user_text_message("é" * 1000)  # 2 bytes each in UTF-8
    assert "messages[0]: 2" in refusal(big, limits=limits)
    assert "the limit is 2000 (THINK_JOBS_MAX_MESSAGE_BYTES)" in refusal(big, limits=limits)
    parts = {"id": "m", "role": "user", "parts": [{"type": "step-start"}] * 4}
    assert refusal(parts, limits=limits) == (
        "messages[0].parts: 4 parts; the limit is 3 (THINK_JOBS_MAX_PARTS_PER_MESSAGE)"
    )
    halves = [user_text_message("x" * 900) for _ in range(4)]
    assert "the limit is 3000 (THINK_JOBS_MAX_SUBMISSION_BYTES)" in refusal(*halves, limits=limits)
    many = [user_text_message("x")] * 4
    assert "the limit is 2 (THINK_JOBS_MAX_MESSAGES_PER_SUBMISSION)" in refusal(
        *many, limits=Limits(messages_per_submission=2)
    )


def test_ids_and_names_in_messages_are_short_and_free_of_control_characters() -> None:
    assert "messages[0].id: 256 characters; the limit is 255" in refusal(
        {"id": "m" * 256, "role": "user", "parts": []}
    )
    assert "messages[0].id: must not contain control characters" in refusal(
        {"id": "m\x00", "role": "user", "parts": []}
    )
    tool = {"type": "tool-" + "t" * 300, "toolCallId": "c", "state": "input-available"}
    assert "messages[0].parts[0].type: 305 characters" in refusal(
        {"id": "m", "role": "assistant", "parts": [tool]}
    )


def test_limits_come_from_the_settings() -> None:
    limits = Limits.of(Settings(max_json_depth=5, max_parts_per_message=9, max_message_bytes=2048))
    assert (limits.json_depth, limits.parts_per_message, limits.message_bytes) == (5, 9, 2048)
    assert Limits.of(Settings()) == Limits()


def test_the_depth_setting_is_capped_so_stored_messages_read_back() -> None:
    with pytest.raises(ValueError, match="less than or equal to 128"):
        Settings(max_json_depth=129)
    deepest = data_message(nested(128))
    wire = coerce_message(deepest, limits=Limits(json_depth=128)).to_wire()
    assert stored_messages(json.dumps([wire]))[0].to_wire() == wire


def test_metadata_is_checked_for_depth_values_and_bytes() -> None:
    limits = Limits(metadata_bytes=40)
    with pytest.raises(MessageValidationError, match=r"^metadata: nested 256 levels deep"):
        json_object({"a": nested(255)}, "metadata", limits=limits)
    with pytest.raises(MessageValidationError, match=r"metadata.x: nan is not a JSON number"):
        json_object({"x": float("nan")}, "metadata", limits=limits)
    with pytest.raises(MessageValidationError, match=r"metadata is 45 bytes as JSON; the limit"):
        json_object({"k": "v" * 37}, "metadata", limits=limits)
    assert json_object({"k": ["v"]}, "metadata", limits=limits) == {"k": ["v"]}


# -- the id rule -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["a", "order-42", "...", ".a", "a.", "new one", "~!$%&'()*+,;=:@?#[]"]
)
def test_ids_that_round_trip_in_a_url_are_accepted(value: str) -> None:
    assert identifier(value, "submission_id") == value


@pytest.mark.parametrize(
    "value",
    [
        ".",
        "..",
        "a/b",
        "/",
        " a",
        "a ",
        " ",
        "\u00d7\u00f8",
        "tab\t",
        "line\n",
        "nul\x00",
        "",
        "\u00e9",
    ],
)
def test_ids_that_cannot_round_trip_in_a_url_are_refused(value: str) -> None:
    with pytest.raises(InvalidInputError, match="submission_id"):
        identifier(value, "submission_id")


def test_keys_are_ids_without_spaces() -> None:
    assert key("evt_123:retry-1", "idempotency_key") == "evt_123:retry-1"
    for bad in ("two words", "..", "a/b", "\u00d7\u00f8", "k" * 513):
        with pytest.raises(InvalidInputError, match="idempotency_key"):
            key(bad, "idempotency_key")


def test_agent_names_follow_the_id_rule_and_200_characters() -> None:
    assert agent_name("n" * 200) == "n" * 200
    for bad in ("n" * 201, ".", "..", "a/b"):
        with pytest.raises(InvalidInputError, match="agent name"):
            agent_name(bad)


# -- reading back ------------------------------------------------------------------------------


def test_an_unreadable_stored_message_is_named_not_a_pydantic_error() -> None:
    good = user_text_message("hi").to_wire()
    stored = json.dumps([good, data_message(nested(250), "deep-1"), good])
    with pytest.raises(StoredMessageError) as caught:
        stored_messages(stored)
    error = caught.value
    assert (error.message_id, error.position) == ("deep-1", 1)
    assert "recursion limit" in error.reason
    assert "think-jobs messages remove|repair TYPE NAME deep-1" in str(error)
    assert error.describe("Support", "c-42").endswith(
        "(think-jobs messages remove|repair Support c-42 deep-1)"
    )


def test_a_stored_message_error_keeps_its_fields_through_pickle() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(StoredMessageError("m-9", "bad", 3)))
    assert (error.message_id, error.reason, error.position) == ("m-9", "bad", 3)


def test_array_elements_and_leading_id_scan_text_without_parsing() -> None:
    deep = '{"id": "d\\"q", "parts": ' + "[" * 5000 + "]" * 5000 + "}"
    text = '[{"id": "a", "s": "x,]}"}, ' + deep + ', {"id": "c"}]'
    elements = array_elements(text)
    assert len(elements) == 3
    assert [leading_id(item) for item in elements] == ["a", 'd"q', "c"]
    assert array_elements("[]") == []
    assert leading_id("[1]") is None


@settings(max_examples=200, deadline=None)
@given(
    data=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=5), children, max_size=3)
        ),
        max_leaves=30,
    ),
    depth=st.integers(min_value=0, max_value=140),
)
def test_accepted_values_read_back_and_refused_ones_are_named(data: Any, depth: int) -> None:
    """Accepted ⇒ the stored JSON reads back as the same wire message; refused ⇒ an error
    that names the data field (never a crash, never pydantic's own text)."""
    value = [data]
    for _ in range(depth):
        value = [value]
    message = data_message(value)
    try:
        wire = coerce_message(message, path="messages[0]").to_wire()
    except MessageValidationError as error:
        assert str(error).startswith("messages[0].parts[1].data")
        return
    assert stored_messages(json.dumps([wire]))[0].to_wire() == wire
    assert json.loads(json.dumps(wire)) == wire


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain", "plain"),
        ("é 😀", "é 😀"),
        ("a\ud800b", "a\ufffdb"),  # a lone high surrogate
        ("\udc80", "\ufffd"),  # a lone low one
        ("x\ud83d\ude00", "x\U0001f600"),  # a pair held as two code points is its character
        ("\ude00\ud83d", "\ufffd\ufffd"),  # the wrong order is two lone ones
    ],
)
def test_well_formed_text_replaces_each_lone_surrogate(text: str, expected: str) -> None:
    assert well_formed(text) == expected
    assert well_formed(text).encode("utf-8")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain", "plain"),
        ("bad\x00", "bad\ufffd"),  # PostgreSQL text cannot hold NUL
        ("\x00\ud800\x00", "\ufffd\ufffd\ufffd"),
        ("x\ud83d\ude00", "x\U0001f600"),
        ("", ""),
    ],
)
def test_storable_text_replaces_nul_and_lone_surrogates(text: str, expected: str) -> None:
    assert storable_text(text) == expected


def test_storable_text_cuts_long_text_with_an_ellipsis_where_it_was_cut() -> None:
    exact = "y" * ERROR_MAX_CHARS
    assert storable_text(exact) == exact
    cut = storable_text("y" * (ERROR_MAX_CHARS + 1))
    assert len(cut) == ERROR_MAX_CHARS and cut == "y" * (ERROR_MAX_CHARS - 1) + "…"
    assert storable_text("\x00" * 10_000_000, max_chars=3) == "\ufffd\ufffd…"
    assert storable_text("abc\ud83d\ude00", max_chars=4) == "abc…"  # a pair is not split


@pytest.mark.parametrize(
    "number",
    [0, -1, 2**53 + 1, 2**64, MAX_JSON_INTEGER, -MAX_JSON_INTEGER],
    ids=["0", "-1", "2**53+1", "2**64", "max", "-max"],
)
def test_integers_a_json_reader_holds_are_accepted(number: int) -> None:
    assert scalar_problem(number) is None
    assert json.loads(json.dumps(number)) == number


@pytest.mark.parametrize(
    ("number", "digits"),
    [
        (MAX_JSON_INTEGER + 1, 309),
        (-MAX_JSON_INTEGER - 1, 309),
        (10**5000, 5001),
        (-(10**9999), 10000),
    ],
    ids=["max+1", "-max-1", "10**5000", "-10**9999"],
)
def test_integers_past_the_bound_are_refused_naming_the_bound(number: int, digits: int) -> None:
    problem = scalar_problem(number)
    assert problem == (
        f"an integer of about {digits} digits; JSON integers must be within ±1.8e+308 "
        "(what JavaScript and most JSON readers can hold)"
    )
    found = value_problem({"a": [1, number]}, "metadata", depth_limit=8)
    assert found == f"metadata.a[1]: {problem}"


def test_a_huge_integer_in_a_message_or_metadata_is_the_packages_error() -> None:
    with pytest.raises(
        MessageValidationError, match=r"^messages\[0\]\.parts\[1\]\.data\[0\]: an int"
    ):
        coerce_messages([data_message([10**5000])])
    with pytest.raises(MessageValidationError, match=r"^metadata\.n: an integer of about 5001"):
        json_object({"n": 10**5000}, "metadata", limits=DEFAULT_LIMITS)
