"""The one place lmedge talks to an LLM: an OpenAI-compatible chat endpoint.

`LLMClient.ask` sends a system + user prompt and asks for a reply that is one
JSON object of a decision model. It owns everything that can go wrong on the
LLM side and turns it into an `LLMReply`, never an exception:

- transport: timeouts, connection errors, 429 and 5xx are retried with a short
  backoff while the decision's time budget lasts (the SDK's own retries are
  off, because its backoff does not know about the slot);
- structured output: `response_format: json_schema, strict` with the schema
  from `lmedge.api.schema.strict_json_schema`; an endpoint that rejects it
  with an HTTP 400 naming the format is remembered (per base URL and model,
  process-wide) and asked with `{"type": "json_object"}` and the schema in
  the prompt from then on;
- the response body: read as plain JSON, not through the SDK's models, which
  hand back a `str` for an HTML page and `None` for `message: null`; a 200
  that is not a chat completion counts as a failed call (retried like a 5xx),
  and token counts that are not integers in [0, `MAX_TOKENS`] are estimated
  instead of trusted;
- content: the decision is extracted robustly (a UTF-8 BOM stripped, the
  first fenced block or the first balanced JSON object taken from prose;
  `NaN`/`Infinity` refused); a reply that holds no such object or not the
  model is answered once with the error (a *repair* turn) when time allows;
  so is a reply the caller's `check` finds infeasible.

It does not decide what to do with a failed reply (the agents fall back) and
it never sees user prompt text: callers pass rendered telemetry only.
"""

from __future__ import annotations

import json
import re
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import openai
from pydantic import BaseModel, ValidationError

from lmedge.agents.settings import LLMSettings
from lmedge.api.schema import strict_json_schema

M = TypeVar("M", bound=BaseModel)
OutputMode = Literal["json_schema", "json_object"]

#: Endpoints (base URL, model) that answered 400 to `json_schema`.
_NO_JSON_SCHEMA: set[tuple[str, str]] = set()
_NO_JSON_SCHEMA_LOCK = threading.Lock()

#: First backoff after a transient failure, seconds; doubles per retry, and is
#: never more than a quarter of what is left of the budget.
BACKOFF_S = 0.2

#: Largest token count taken from an endpoint's `usage`; anything above (or not
#: an integer) is a bogus number and replaced by an estimate. Ten million is
#: far beyond any context window yet small enough for every store and metric.
MAX_TOKENS = 10_000_000

#: Positions of `{` tried when looking for a JSON object inside prose: bounds
#: the work on a long, JSON-less reply (each try is linear in the reply).
MAX_OBJECT_STARTS = 64


def forget_endpoint_capabilities() -> None:
    """Forget which endpoints rejected `json_schema` (tests start clean)."""
    with _NO_JSON_SCHEMA_LOCK:
        _NO_JSON_SCHEMA.clear()


@dataclass
class LLMReply(Generic[M]):
    """What one decision's exchange with the LLM produced.

    `value` is set when the last reply parsed into the model; `violations` are
    the caller's `check` findings on it (empty when feasible). `raw` is the
    last reply verbatim. Tokens and latency add up every HTTP attempt.
    """

    value: M | None = None
    raw: str | None = None
    parsed: bool = False
    violations: list[str] = field(default_factory=list)
    error: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    calls: int = 0
    repairs: int = 0
    model: str | None = None
    mode: OutputMode = "json_schema"


def estimate_tokens(text: str) -> int:
    """Rough token count (4 characters a token) for endpoints that omit usage."""
    return max(1, len(text) // 4)


_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\r?\n(.*?)```", re.DOTALL)


class _NotFinite(ValueError):
    pass


def _no_constants(name: str) -> Any:
    # json.loads accepts NaN, Infinity and -Infinity, which are not JSON and
    # would pass `ge`/`le` bounds as inf or fail every sum as NaN.
    raise _NotFinite(f"{name} is not a JSON number")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constants)


def extract_json(text: str) -> tuple[Any, str | None]:
    """The JSON value an LLM reply holds, and None; or None and why there is none.

    Tried in order: the whole reply (after a UTF-8 BOM and whitespace); each
    fenced code block; the first balanced JSON object starting at one of the
    first `MAX_OBJECT_STARTS` `{` characters. Models wrap JSON in prose or a
    fence despite the instructions, and the object inside is what they meant.
    """
    t = text.lstrip("\ufeff").strip()
    try:
        return _loads(t), None
    except _NotFinite as exc:
        return None, str(exc)
    except json.JSONDecodeError as exc:
        first = f"{exc.msg} at char {exc.pos}"
    for block in _FENCE.findall(t):
        try:
            return _loads(block.strip()), None
        except _NotFinite as exc:
            return None, str(exc)
        except json.JSONDecodeError:
            continue
    decoder = json.JSONDecoder(parse_constant=_no_constants)
    start = t.find("{")
    for _ in range(MAX_OBJECT_STARTS):
        if start < 0:
            break
        try:
            value, _end = decoder.raw_decode(t, start)
        except _NotFinite as exc:
            return None, str(exc)
        except json.JSONDecodeError:
            start = t.find("{", start + 1)
            continue
        return value, None
    return None, first


def _token_count(value: Any) -> int | None:
    """A usage count the endpoint reported, or None when it is not a plausible one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 0 <= value <= MAX_TOKENS:
        return value
    return None


class _BadBody(Exception):
    """A 200 response that is not a chat completion (an HTML page, a list, ...)."""


def _completion_content(body: Any) -> str | None:
    """The first choice's text of a chat-completion body; None when it has none.

    Raises `_BadBody` when the body is not a chat completion at all.
    """
    if not isinstance(body, dict) or "choices" not in body:
        raise _BadBody("the response is not a chat completion")
    choices = body["choices"]
    if not isinstance(choices, list):
        raise _BadBody("`choices` is not a list")
    if not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return None
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Content parts ({"type": "text", "text": ...}), as some servers answer.
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        return "".join(t for t in texts if isinstance(t, str)) or None
    return None


def _usage(body: Any) -> tuple[int | None, int | None]:
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None, None
    return _token_count(usage.get("prompt_tokens")), _token_count(usage.get("completion_tokens"))


def _describe_validation(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors()[:6]:
        loc = ".".join(str(p) for p in e["loc"]) or "(root)"
        parts.append(f"{loc}: {e['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


class LLMClient:
    """A chat client bound to one agent's settings (thread-safe; one per agent)."""

    def __init__(self, settings: LLMSettings, *, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self._clock = clock
        self._client = openai.OpenAI(
            api_key=settings.key(),
            base_url=settings.base_url,
            timeout=settings.timeout_s,
            max_retries=0,
        )
        # Plugins are not closed by the loop: release the kept-alive connections when
        # this client goes away (the finalizer holds the SDK client until then).
        self._finalizer = weakref.finalize(self, self._client.close)

    @property
    def _endpoint(self) -> tuple[str, str]:
        return (str(self._client.base_url), self.settings.model)

    def output_mode(self) -> OutputMode:
        with _NO_JSON_SCHEMA_LOCK:
            return "json_object" if self._endpoint in _NO_JSON_SCHEMA else "json_schema"

    def close(self) -> None:
        self._finalizer()

    def ask(
        self,
        system: str,
        user: str,
        model: type[M],
        schema_name: str,
        check: Callable[[M], list[str]] | None = None,
    ) -> LLMReply[M]:
        """One decision: ask, retry transient failures, repair once; never raises."""
        s = self.settings
        start = self._clock()
        deadline = start + s.budget_s
        reply: LLMReply[M] = LLMReply(model=s.model, mode=self.output_mode())
        messages: list[dict[str, str]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]
        retries_left = s.max_retries
        repairs_left = 1
        backoff = BACKOFF_S
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0.01:
                reply.error = reply.error or "time budget exhausted before a reply"
                break
            reply.mode = self.output_mode()
            t0 = self._clock()
            try:
                content, usage = self._create(messages, model, schema_name, reply.mode, remaining)
            except openai.BadRequestError as exc:
                reply.calls += 1
                if reply.mode == "json_schema" and _about_output_format(exc):
                    # The endpoint does not take strict json_schema: remember it and ask again
                    # in JSON mode at once; this does not count as a retry.
                    with _NO_JSON_SCHEMA_LOCK:
                        _NO_JSON_SCHEMA.add(self._endpoint)
                    reply.error = f"json_schema rejected (400), using json_object: {_msg(exc)}"
                    continue
                reply.error = f"bad request (400): {_msg(exc)}"
                break
            except (openai.APIConnectionError, openai.RateLimitError) as exc:
                reply.calls += 1
                reply.error = _classify(exc)
                if retries_left > 0 and deadline - self._clock() > backoff * 2:
                    retries_left -= 1
                    time.sleep(min(backoff, (deadline - self._clock()) / 4))
                    backoff *= 2
                    continue
                break
            except openai.APIStatusError as exc:
                reply.calls += 1
                reply.error = _classify(exc)
                if exc.status_code >= 500 and retries_left > 0:
                    retries_left -= 1
                    if deadline - self._clock() > backoff * 2:
                        time.sleep(min(backoff, (deadline - self._clock()) / 4))
                        backoff *= 2
                        continue
                break
            except _BadBody as exc:
                reply.calls += 1
                reply.error = f"LLM endpoint answered 200 without a chat completion: {exc}"
                if retries_left > 0 and deadline - self._clock() > backoff * 2:
                    retries_left -= 1
                    time.sleep(min(backoff, (deadline - self._clock()) / 4))
                    backoff *= 2
                    continue
                break
            except openai.OpenAIError as exc:
                reply.calls += 1
                reply.error = f"LLM call failed: {type(exc).__name__}: {exc}"
                break
            finally:
                reply.latency_s += self._clock() - t0
            reply.calls += 1
            reply.raw = content
            prompt_chars = sum(len(m["content"]) for m in messages)
            reply.tokens_in += usage[0] if usage[0] else max(1, prompt_chars // 4)
            reply.tokens_out += usage[1] if usage[1] else estimate_tokens(content or "")
            feedback = self._judge(reply, model, check)
            if feedback is None:
                break
            # One repair turn, only if another full attempt still fits in the budget.
            if repairs_left == 0 or deadline - self._clock() < min(s.timeout_s, s.budget_s) / 2:
                break
            repairs_left -= 1
            reply.repairs += 1
            messages = [
                *messages,
                {"role": "assistant", "content": content or ""},
                {"role": "user", "content": feedback},
            ]
        reply.latency_s = max(reply.latency_s, 0.0)
        return reply

    def _judge(
        self, reply: LLMReply[M], model: type[M], check: Callable[[M], list[str]] | None
    ) -> str | None:
        """Parse and check the reply; return repair feedback, or None when done."""
        reply.value, reply.parsed, reply.violations = None, False, []
        if reply.raw is None or not reply.raw.strip():
            reply.error = "empty reply (refusal or no content)"
            return "Your reply was empty. Reply with the JSON object only."
        data, problem = extract_json(reply.raw)
        if problem is not None:
            reply.error = f"reply is not JSON: {problem}"
            return f"Your reply is not valid JSON ({problem}). Reply with the JSON object only."
        try:
            reply.value = model.model_validate(data)
        except ValidationError as exc:
            reply.error = f"reply does not match the schema: {_describe_validation(exc)}"
            return (
                f"Your reply does not match the schema: {_describe_validation(exc)}. "
                "Reply again with a corrected JSON object."
            )
        reply.parsed = True
        reply.error = None
        if check is not None:
            reply.violations = check(reply.value)
            if reply.violations:
                listed = "; ".join(reply.violations[:8])
                return (
                    f"Your decision is infeasible: {listed}. "
                    "Reply again with a corrected JSON object that fixes every item."
                )
        return None

    def _create(
        self,
        messages: list[dict[str, str]],
        model: type[M],
        schema_name: str,
        mode: OutputMode,
        remaining_s: float,
    ) -> tuple[str | None, tuple[int | None, int | None]]:
        schema = strict_json_schema(model)
        response_format: dict[str, Any]
        if mode == "json_schema":
            response_format = {
                "type": "json_schema",
                "json_schema": {"name": schema_name, "schema": schema, "strict": True},
            }
            sent = messages
        else:
            response_format = {"type": "json_object"}
            hint = (
                "\n\nReply with one JSON object (no prose, no code fence) valid against "
                f"this JSON Schema named {schema_name}:\n"
                + json.dumps(schema, separators=(",", ":"))
            )
            sent = [{"role": messages[0]["role"], "content": messages[0]["content"] + hint}]
            sent += messages[1:]
        raw = self._client.chat.completions.with_raw_response.create(  # type: ignore[call-overload]
            model=self.settings.model,
            messages=sent,
            response_format=response_format,
            timeout=min(self.settings.timeout_s, remaining_s),
        )
        # The SDK builds its models without validation (a `str` for an HTML page,
        # `message=None` kept as is): read the body as plain JSON and check each step.
        try:
            body = _loads(raw.http_response.text.lstrip("\ufeff"))
        except ValueError as exc:
            ctype = raw.http_response.headers.get("content-type", "no content type")
            raise _BadBody(f"the body is not JSON ({ctype})") from exc
        return _completion_content(body), _usage(body)


def _msg(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:200]
    return str(exc)[:200]


#: Words of a 400 answer that blame the output format rather than the prompt
#: (OpenAI, vLLM, llama.cpp and Ollama phrasings).
_FORMAT_WORDS = ("response_format", "json_schema", "schema", "format", "guided")


def _about_output_format(exc: openai.BadRequestError) -> bool:
    text = _msg(exc).lower()
    return any(w in text for w in _FORMAT_WORDS)


def _classify(exc: openai.OpenAIError) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return "LLM call timed out"
    if isinstance(exc, openai.APIConnectionError):
        return f"cannot reach the LLM endpoint: {exc}"
    if isinstance(exc, openai.RateLimitError):
        return "LLM endpoint throttled the call (429)"
    if isinstance(exc, openai.APIStatusError):
        return f"LLM endpoint failed ({exc.status_code}): {_msg(exc)}"
    return f"LLM call failed: {exc}"
