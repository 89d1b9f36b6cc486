"""A stored reply rebuilt as stream chunks (``think_jobs.replay``): whatever the model streamed,
``render`` rebuilds the reply, and ``suffix`` completes any prefix of its stream exactly."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from think_jobs.messages import DataPart, FilePart, TextPart, ToolApproval, ToolPart, UIMessage
from think_jobs.replay import assemble, extension, rebuilds, render, suffix

words = st.text(alphabet="abc é\n", min_size=0, max_size=6)


@st.composite
def block(draw: st.DrawFn, kind: str, block_id: str) -> list[dict[str, Any]]:
    deltas = draw(st.lists(words, max_size=3))
    chunks = [{"type": f"{kind}-start", "id": block_id}]
    chunks += [{"type": f"{kind}-delta", "id": block_id, "delta": d} for d in deltas]
    return chunks + ([{"type": f"{kind}-end", "id": block_id}] if draw(st.booleans()) else [])


@st.composite
def tool_call(draw: st.DrawFn, call_id: str) -> list[dict[str, Any]]:
    dynamic = draw(st.booleans())
    head = {"toolCallId": call_id, "toolName": "lookup", **({"dynamic": True} if dynamic else {})}
    chunks = [{"type": "tool-input-start", **head}]
    if draw(st.booleans()):
        chunks.append({"type": "tool-input-available", **head, "input": {"q": draw(words)}})
        outcome = draw(st.sampled_from(["none", "output", "error", "asked", "denied"]))
        if outcome == "output":
            chunks.append({"type": "tool-output-available", "toolCallId": call_id, "output": [1]})
        elif outcome == "error":
            chunks.append({"type": "tool-output-error", "toolCallId": call_id, "errorText": "x"})
        elif outcome in ("asked", "denied"):  # a tool that needs approval (SPEC §13)
            asked = {"type": "tool-approval-request", "approvalId": f"a-{call_id}"}
            chunks.append({**asked, "toolCallId": call_id})
            if outcome == "denied":
                chunks.append({"type": "tool-output-denied", "toolCallId": call_id})
    return chunks


@st.composite
def stream(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A model's stream as the runner frames it: steps of blocks, tools, data and sources."""
    chunks: list[dict[str, Any]] = [{"type": "start", "messageId": "m1"}]
    for step in range(draw(st.integers(1, 3))):
        chunks.append({"type": "start-step"})
        for n in range(draw(st.integers(0, 3))):
            ident = f"{step}-{n}"
            kind = draw(st.sampled_from(["text", "reasoning", "tool", "data", "source"]))
            if kind in ("text", "reasoning"):
                chunks += draw(block(kind, ident))
            elif kind == "tool":
                chunks += draw(tool_call(ident))
            elif kind == "data":
                chunks.append({"type": "data-note", "id": ident, "data": {"n": n}})
            else:
                chunks.append({"type": "source-url", "sourceId": ident, "url": "https://x.test"})
        chunks.append({"type": "finish-step"})
    if draw(st.booleans()):
        chunks.append({"type": "message-metadata", "messageMetadata": {"k": draw(words)}})
    return [*chunks, {"type": "finish"}]


@settings(max_examples=300, deadline=None)
@given(stream())
def test_render_rebuilds_any_streamed_reply(chunks: list[dict[str, Any]]) -> None:
    reply = assemble(chunks, "m1")
    assert rebuilds(render(reply), reply)


@settings(max_examples=300, deadline=None)
@given(stream(), st.data())
def test_suffix_completes_every_prefix_of_the_stream(
    chunks: list[dict[str, Any]], data: st.DataObject
) -> None:
    reply = assemble(chunks, "m1")
    cut = data.draw(st.integers(0, len(chunks)))
    rest = suffix(chunks[:cut], reply)
    assert rest is not None
    assert rebuilds(chunks[:cut] + rest, reply)


def test_suffix_of_the_whole_stream_adds_nothing_but_what_is_missing() -> None:
    chunks = [
        {"type": "start", "messageId": "m1"},
        {"type": "start-step"},
        {"type": "text-start", "id": "t"},
        {"type": "text-delta", "id": "t", "delta": "hello"},
        {"type": "text-end", "id": "t"},
        {"type": "finish-step"},
        {"type": "finish"},
    ]
    assert suffix(chunks, assemble(chunks, "m1")) == []


def test_suffix_refuses_a_reply_that_does_not_extend_the_stream() -> None:
    shown = [
        {"type": "start", "messageId": "m1"},
        {"type": "start-step"},
        {"type": "text-start", "id": "t"},
        {"type": "text-delta", "id": "t", "delta": "hello"},
    ]
    other = UIMessage(id="m1", role="assistant", parts=[TextPart(text="goodbye", state="done")])
    assert suffix(shown, other) is None


def test_interruptions_in_the_stream_are_not_part_of_the_reply() -> None:
    chunks = [
        {"type": "start", "messageId": "m1"},
        {"type": "start-step"},
        {"type": "text-start", "id": "t"},
        {"type": "text-delta", "id": "t", "delta": "hel"},
        {"type": "abort"},
    ]
    reply = assemble([*chunks[:3], {"type": "text-delta", "id": "t", "delta": "hello"}], "m1")
    rest = suffix(chunks, reply)
    assert rest is not None and rebuilds(chunks + rest, reply)


def test_render_keeps_parts_a_chunk_cannot_carry_out_only_where_they_cannot_be() -> None:
    with_name = UIMessage(
        id="m1",
        role="assistant",
        parts=[FilePart(media_type="text/plain", url="data:,x", filename="x.txt")],
    )
    assert not rebuilds(render(with_name), with_name)  # a file chunk has no file name
    data = UIMessage(id="m1", role="assistant", parts=[DataPart(type="data-x", data={"a": [1]})])
    assert rebuilds(render(data), data)


@settings(max_examples=300, deadline=None)
@given(stream(), st.data())
def test_suffix_completes_every_prefix_of_a_stream_that_extends_a_reply(
    chunks: list[dict[str, Any]], data: st.DataObject
) -> None:
    """An approval's continuation streams only what it adds to the reply it answers (its
    ``base``, which ended with a step): applied to that reply, any prefix is completed."""
    steps_end = [n + 1 for n, chunk in enumerate(chunks) if chunk["type"] == "finish-step"]
    split = data.draw(st.sampled_from(steps_end))
    base = assemble(chunks[:split], "m1")
    added = [{"type": "start", "messageId": "m1"}, *chunks[split:]]
    reply = assemble(added, "m1", base=base)
    whole = extension(reply, base)
    assert whole is not None and rebuilds(whole, reply, base=base)
    cut = data.draw(st.integers(0, len(added)))
    rest = suffix(added[:cut], reply, base=base)
    assert rest is not None
    assert rebuilds(added[:cut] + rest, reply, base=base)


def _call(call_id: str, state: str, **fields: Any) -> ToolPart:
    return ToolPart(type="tool-pay", tool_call_id=call_id, state=state, input={}, **fields)


def test_a_continuation_rebuilt_from_nothing_carries_every_answered_call_s_outcome() -> None:
    """Two calls answered at once: the continuation's stream gives both their outcome, the
    earlier one included (only a tool call can change before the stream's last part)."""
    yes, no = ToolApproval(id="a1", approved=True), ToolApproval(id="a2", approved=False)
    base = UIMessage(
        id="m1",
        role="assistant",
        parts=[
            _call("c1", "approval-responded", approval=yes),
            _call("c2", "approval-responded", approval=no),
        ],
    )
    reply = UIMessage(
        id="m1",
        role="assistant",
        parts=[
            _call("c1", "output-available", output="paid", approval=yes),
            _call("c2", "output-denied", approval=no),
            TextPart(text="done", state="done"),
        ],
    )
    rest = extension(reply, base)
    assert rest is not None and rebuilds(rest, reply, base=base)
    kinds = [chunk["type"] for chunk in rest]
    assert kinds[:3] == ["start", "tool-output-available", "tool-output-denied"]
    assert kinds[-1] == "finish"
