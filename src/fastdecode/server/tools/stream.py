"""One choice's reply read for tool calls, as OpenAI's streamed deltas and final message.

Streamed: content deltas for the free text, then per call one delta with its
`index`, `id`, `type` and `function.name` (arguments "" or the first
fragment), then `function.arguments` fragments. Whole: `message.tool_calls`
with the same ids and argument strings, `content` null when there is no text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..protocol import AssistantMessage, Delta, FunctionCall, FunctionDelta, ToolCall, ToolCallDelta
from .formats import ToolFormat
from .parse import Arguments, CallParser, CallStart, Content, Event, new_call_id, new_short_id
from .spec import ToolSpec


@dataclass(frozen=True)
class ToolSetup:
    """What a chat request's choices need to read their calls."""

    format: ToolFormat
    spec: ToolSpec

    def reader(self) -> "ToolReader":
        new_id = new_short_id if self.format.short_ids else new_call_id
        return ToolReader(CallParser(self.format, (f.name for f in self.spec.callable), new_id))


class ToolReader:
    def __init__(self, parser: CallParser):
        self.parser = parser

    def deltas(self, text: str, finished: bool) -> list[Delta]:
        """What `text` (the choice's next piece) adds; `finished`: it was the last."""
        events = self.parser.feed(text) if text else []
        if finished:
            events += self.parser.finish()
        deltas = to_deltas(events)
        if finished and self.parser.content == "":
            # Neither text nor calls: the whole message's content is "", so the stream says so (its
            # first delta cannot, not knowing yet whether the reply is calls only, content null).
            deltas.append(Delta(content=""))
        return deltas

    def message(self) -> AssistantMessage:
        calls = [ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
                 for c in self.parser.calls]
        return AssistantMessage(content=self.parser.content, tool_calls=calls or None)

    def finish_reason(self, reason: Optional[str]) -> Optional[str]:
        # A stop string can end the reply inside a call: that reply is not a complete set of calls.
        calls = self.parser.calls
        return "tool_calls" if reason == "stop" and calls and all(c.complete for c in calls) else reason


def to_deltas(events: list[Event]) -> list[Delta]:
    """Events as deltas; a call's fragments that arrive together go in one delta."""
    out: list[Delta] = []
    for e in events:
        last = out[-1].tool_calls[-1] if out and out[-1].tool_calls else None
        if isinstance(e, Content):
            out.append(Delta(content=e.text))
        elif isinstance(e, CallStart):
            out.append(Delta(tool_calls=[ToolCallDelta(index=e.index, id=e.id, type="function",
                                                       function=FunctionDelta(name=e.name, arguments=""))]))
        elif isinstance(e, Arguments) and last is not None and last.index == e.index:
            last.function.arguments = (last.function.arguments or "") + e.text
        else:
            out.append(Delta(tool_calls=[ToolCallDelta(index=e.index, function=FunctionDelta(arguments=e.text))]))
    return out
