"""Server-sent events: reading them line by line, and writing them.

Every stream the gateway handles is SSE: a model pod's (`/infer/stream`, or
an OpenAI-speaking engine's `/v1/chat/completions` with `stream: true`),
another gateway's (`/internal/stream`) and the user's (OpenAI chunks). This
module is the format only (the WHATWG rules the OpenAI servers follow:
`field: value` lines, `data` lines joined by newlines, an empty line ends an
event, `:` starts a comment); what an event's data means is the business of
its reader (`lmedge.dataplane.engines`, `clients`, `openai`). No I/O.

A line longer than `MAX_LINE` characters is refused (`MalformedStream`): a
peer that never ends a line must not grow the gateway's memory without bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmedge.errors import ModelFailed

__all__ = ["MAX_LINE", "MalformedStream", "SseDecoder", "SseEvent", "format_event"]

#: Longest line accepted, characters (an OpenAI chunk is well under 4 KiB; a
#: base64 image in one event fits).
MAX_LINE = 16 * 1024 * 1024


class MalformedStream(ModelFailed):
    """A stream that is not the SSE, or not the events, its reader expects."""


@dataclass(frozen=True)
class SseEvent:
    """One event: its `event` field (None for the default, `message`) and its data."""

    data: str
    event: str | None = None


class SseDecoder:
    """Turns lines (without their line ending) into events, one `line` call per line."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event: str | None = None

    def line(self, line: str) -> SseEvent | None:
        """The event this line completes (an empty line ends one), else None."""
        if len(line) > MAX_LINE:
            raise MalformedStream(f"an event line of over {MAX_LINE} characters")
        if not line:
            if not self._data and self._event is None:
                return None
            event = SseEvent(data="\n".join(self._data), event=self._event)
            self._data, self._event = [], None
            return event
        if line.startswith(":"):
            return None  # a comment (keep-alive)
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        # `id` and `retry` matter to reconnecting browsers only; unknown fields are ignored.
        return None

    def end(self) -> SseEvent | None:
        """An event left open when the stream closed without its blank line, if any."""
        return self.line("")


def format_event(data: str, event: str | None = None) -> bytes:
    """One event as bytes; multi-line data becomes several `data` lines."""
    head = f"event: {event}\n" if event else ""
    body = "".join(f"data: {part}\n" for part in data.split("\n"))
    return (head + body + "\n").encode()
