"""The one place lmedge talks to an LLM: an OpenAI-compatible chat endpoint.

`LLMClient.ask` sends a system + user prompt and asks for a reply that is one
JSON object of a decision model. It owns everything that can go wrong on the
LLM side and turns it into an `LLMReply`, never an exception:

- transport: timeouts, connection errors, 429 and 5xx are retried with a short
  backoff while the decision's time budget lasts (the SDK's own retries are
  off, because its backoff does not know about the slot);
- structured output, in the endpoint's dialect: OpenAI `response_format:
  json_schema, strict`; llama.cpp's `{"type": "json_object", "schema": S}`
  (grammar-constrained decoding); or plain `{"type": "json_object"}` with the
  schema in the prompt. The schema is the caller's `ReplyFormat` (enums of
  the scenario's names, fixed array lengths) or the decision model's strict
  schema. A call whose dialect is refused -- whatever the status of the
  refusal: llama-cpp-python says 500, others 400 or 422 -- is asked again in
  the next dialect at once (not counted as a retry). The endpoint (base URL
  and model, process-wide) is remembered to speak the next dialect only
  after `DIALECT_REFUSALS` consecutive refusals of one dialect, and asked in
  the better one again every `REPROBE_S` seconds: one error message does not
  degrade (nor serialise) a capable endpoint for the rest of the process;
- generation bounds: every request carries `max_tokens` sized to the reply
  and a temperature, so no abandoned request can generate for minutes; an
  endpoint remembered to speak the llama.cpp dialect serves one request at a time,
  so calls to it are serialised (a lock per endpoint, waited on inside the
  budget) and a timed-out call is not retried there (the retry would only
  queue behind the abandoned generation);
- the response body: read as plain JSON, not through the SDK's models, which
  hand back a `str` for an HTML page and `None` for `message: null`; a 200
  that is not a chat completion counts as a failed call (retried like a 5xx),
  and token counts that are not integers in [0, `MAX_TOKENS`] are estimated
  instead of trusted;
- content: the decision is extracted robustly (a UTF-8 BOM stripped, the
  first fenced block or the first balanced JSON object taken from prose;
  `NaN`/`Infinity` refused); a reply that holds no such object or not the
  model is answered once with the error (a *repair* turn) when time allows;
  so is a reply the caller's `check` finds infeasible. The repair turn lists
  every problem, not the first few.

It does not decide what to do with a failed reply (the agents fall back) and
it never sees user prompt text: callers pass rendered telemetry only.
"""

from __future__ import annotations

import json
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import openai
from pydantic import BaseModel, ValidationError

from lmedge.agents.settings import LLMSettings
from lmedge.api.schema import strict_json_schema

M = TypeVar("M", bound=BaseModel)
#: Structured-output dialects, in the order they are tried: OpenAI strict
#: `json_schema`; llama.cpp's `json_object` + `schema` (grammar decoding);
#: plain `json_object` with the schema in the prompt.
OutputMode = Literal["json_schema", "json_object_schema", "json_object"]
_NEXT_MODE: dict[OutputMode, OutputMode] = {
    "json_schema": "json_object_schema",
    "json_object_schema": "json_object",
}

_MODES: tuple[OutputMode, ...] = ("json_schema", "json_object_schema", "json_object")

#: Consecutive refusals of one dialect (each a 400, 422 or 500 naming the
#: output format) after which an endpoint is remembered not to speak it. One
#: refusal may be a transient error that happens to mention the format (a
#: capable server failing mid-request); three in a row, with no success in
#: that dialect between them, is the server's answer.
DIALECT_REFUSALS = 3
#: Seconds after which an endpoint remembered to speak a lesser dialect is
#: asked in the best one again (one call; a refusal keeps the lesser dialect
#: for another period): a server upgraded or restarted with structured output
#: on, or refusals that were transient after all, are found again.
REPROBE_S = 600.0


@dataclass
class _Dialect:
    """What one endpoint (base URL, model) is known to speak, and its refusals so far."""

    #: The dialect calls start in.
    mode: OutputMode = "json_schema"
    #: When `mode` was last decided (remembered or re-probed), client clock.
    since: float = 0.0
    #: Consecutive refusals per dialect; a success in a dialect resets its count.
    refusals: dict[OutputMode, int] = field(default_factory=dict)
    #: Held by a call while the endpoint is serial (one generation at a time).
    lock: threading.Lock = field(default_factory=threading.Lock)


_DIALECTS: dict[tuple[str, str], _Dialect] = {}
_DIALECT_LOCK = threading.Lock()

#: Sampling temperature sent when the settings give none: low, because a
#: decision should follow the evidence, not explore; not 0, so a repair turn
#: can come out different from the reply it corrects.
DEFAULT_TEMPERATURE = 0.2
#: `max_tokens` when the caller gives no `ReplyFormat`.
DEFAULT_MAX_TOKENS = 1024
#: Statuses a server answers a dialect it does not speak with: 400 (OpenAI,
#: vLLM), 422 (FastAPI validation) and 500 (llama-cpp-python wraps its
#: validation error in an internal error).
_FORMAT_STATUSES = (400, 422, 500)

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


@dataclass
class _Backoff:
    """One decision's retries: how many are left and the next pause before one."""

    retries_left: int
    deadline: float
    clock: Callable[[], float]
    pause_s: float = BACKOFF_S

    def wait(self) -> bool:
        """Pause and return True when a retry is left and still fits the budget; else False.

        The pause doubles per retry and is never more than a quarter of what
        is left of the budget; a retry needs twice the pause left.
        """
        if self.retries_left <= 0 or self.deadline - self.clock() <= self.pause_s * 2:
            return False
        self.retries_left -= 1
        time.sleep(min(self.pause_s, (self.deadline - self.clock()) / 4))
        self.pause_s *= 2
        return True


def forget_endpoint_capabilities() -> None:
    """Forget every endpoint's dialect (tests start clean)."""
    with _DIALECT_LOCK:
        _DIALECTS.clear()


@dataclass(frozen=True)
class ReplyFormat(Generic[M]):
    """What one decision asks the server to generate, and how to read it.

    `schema` is sent as the structured-output schema (the server enforces
    enums and array lengths; numeric bounds it may drop are the model's and
    `check`'s job). `parse` turns the reply's JSON into the decision -- the
    deterministic expander of a compact reply -- raising `ValueError` (or a
    pydantic `ValidationError`) that names every problem. `max_tokens` bounds
    the generation.
    """

    schema: dict[str, Any]
    max_tokens: int
    parse: Callable[[Any], M]


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
    """Every validation error, one `path: message` each (the repair turn lists them all)."""
    parts = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(root)"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


class LLMClient:
    """A chat client bound to one agent's settings (thread-safe; one per agent)."""

    def __init__(
        self,
        settings: LLMSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        http_client: openai.DefaultHttpxClient | None = None,
    ):
        """`http_client`: the HTTP client the SDK sends with (tests pass a mock transport)."""
        self.settings = settings
        self._clock = clock
        self._client = openai.OpenAI(
            api_key=settings.key(),
            base_url=settings.base_url,
            timeout=settings.timeout_s,
            max_retries=0,
            http_client=http_client,
        )
        # Plugins are not closed by the loop: release the kept-alive connections when
        # this client goes away (the finalizer holds the SDK client until then).
        self._finalizer = weakref.finalize(self, self._client.close)

    @property
    def _endpoint(self) -> tuple[str, str]:
        return (str(self._client.base_url), self.settings.model)

    def _state(self) -> _Dialect:  # holds _DIALECT_LOCK
        return _DIALECTS.setdefault(self._endpoint, _Dialect())

    def output_mode(self) -> OutputMode:
        """The dialect this endpoint is remembered to speak (json_schema until refused)."""
        with _DIALECT_LOCK:
            d = _DIALECTS.get(self._endpoint)
            return "json_schema" if d is None else d.mode

    def _start_mode(self) -> OutputMode:
        """The dialect a call starts in: the remembered one, or json_schema to re-probe.

        An endpoint remembered to speak a lesser dialect for `REPROBE_S`
        seconds is asked in json_schema by one call (the re-probe); the other
        calls meanwhile keep the remembered dialect.
        """
        with _DIALECT_LOCK:
            d = _DIALECTS.get(self._endpoint)
            if d is None or d.mode == "json_schema":
                return "json_schema"
            now = self._clock()
            if now - d.since >= REPROBE_S:
                d.since = now
                return "json_schema"
            return d.mode

    def serial(self) -> bool:
        """Whether calls to this endpoint are serialised (one generation at a time).

        Only an endpoint remembered to speak a lesser dialect (llama-cpp-python
        runs one generation at a time) or configured with `concurrency` 1.
        """
        if self.settings.concurrency == 1:
            return True
        with _DIALECT_LOCK:
            d = _DIALECTS.get(self._endpoint)
            return d is not None and d.mode != "json_schema"

    def _refused(self, mode: OutputMode) -> OutputMode | None:
        """Count a refusal of `mode`; the dialect to ask this call in next, or None.

        The endpoint is remembered to speak the next dialect once `mode` was
        refused `DIALECT_REFUSALS` times in a row.
        """
        nxt = _NEXT_MODE.get(mode)
        with _DIALECT_LOCK:
            d = self._state()
            d.refusals[mode] = d.refusals.get(mode, 0) + 1
            if (
                nxt is not None
                and d.refusals[mode] >= DIALECT_REFUSALS
                and _MODES.index(d.mode) <= _MODES.index(mode)
            ):
                d.mode, d.since = nxt, self._clock()
        return nxt

    def _spoken(self, mode: OutputMode) -> None:
        """The endpoint answered a call in `mode`: it speaks it (a re-probe upgrades it)."""
        with _DIALECT_LOCK:
            d = self._state()
            d.refusals[mode] = 0
            if _MODES.index(mode) < _MODES.index(d.mode):
                d.mode, d.since = mode, self._clock()

    @contextmanager
    def _turn(self, wait_s: float) -> Iterator[bool]:
        """Hold the endpoint's lock when it is serial; yields False if not had in time."""
        if not self.serial():
            yield True
            return
        with _DIALECT_LOCK:
            lock = self._state().lock
        got = lock.acquire(timeout=max(0.0, wait_s))
        try:
            yield got
        finally:
            if got:
                lock.release()

    def close(self) -> None:
        self._finalizer()

    def ask(
        self,
        system: str,
        user: str,
        model: type[M],
        schema_name: str,
        check: Callable[[M], list[str]] | None = None,
        fmt: ReplyFormat[M] | None = None,
    ) -> LLMReply[M]:
        """One decision: ask, retry transient failures, repair once; never raises.

        `fmt` gives the schema to enforce, the reply's token bound and the
        parser (default: the model's strict schema, `DEFAULT_MAX_TOKENS`,
        `model.model_validate`).
        """
        s = self.settings
        if fmt is None:
            fmt = ReplyFormat(strict_json_schema(model), DEFAULT_MAX_TOKENS, model.model_validate)
        start = self._clock()
        deadline = start + s.budget_s
        reply: LLMReply[M] = LLMReply(model=s.model, mode=self._start_mode())
        messages: list[dict[str, str]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]
        backoff = _Backoff(s.max_retries, deadline, self._clock)
        repairs_left = 1
        # This call's dialect: the endpoint's remembered one to start with; a
        # refusal moves this call on at once, the endpoint only after repeated ones.
        mode = reply.mode
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0.01:
                reply.error = reply.error or "time budget exhausted before a reply"
                break
            reply.mode = mode
            t0 = self._clock()
            try:
                with self._turn(remaining) as got:
                    if not got:
                        reply.error = "the LLM endpoint serves one call at a time and stayed busy"
                        break
                    content, usage = self._create(
                        messages, fmt, schema_name, reply.mode, deadline - self._clock()
                    )
            except openai.APIStatusError as exc:
                reply.calls += 1
                if exc.status_code in _FORMAT_STATUSES and _about_output_format(exc):
                    nxt = self._refused(reply.mode)
                    if nxt is not None:
                        # Ask again in the next dialect at once; this does not count as a retry.
                        reply.error = (
                            f"{reply.mode} rejected ({exc.status_code}), using {nxt}: {_msg(exc)}"
                        )
                        mode = nxt
                        continue
                reply.error = (
                    f"bad request (400): {_msg(exc)}" if exc.status_code == 400 else _classify(exc)
                )
                transient = isinstance(exc, openai.RateLimitError) or exc.status_code >= 500
                if transient and backoff.wait():
                    continue
                break
            except openai.APIConnectionError as exc:
                reply.calls += 1
                reply.error = _classify(exc)
                if isinstance(exc, openai.APITimeoutError) and self.serial():
                    # The server is still generating the abandoned reply (up to max_tokens):
                    # a retry would only queue behind it.
                    break
                if backoff.wait():
                    continue
                break
            except _BadBody as exc:
                reply.calls += 1
                reply.error = f"LLM endpoint answered 200 without a chat completion: {exc}"
                if backoff.wait():
                    continue
                break
            except openai.OpenAIError as exc:
                reply.calls += 1
                reply.error = f"LLM call failed: {type(exc).__name__}: {exc}"
                break
            finally:
                reply.latency_s += self._clock() - t0
            self._spoken(reply.mode)
            reply.calls += 1
            reply.raw = content
            prompt_chars = sum(len(m["content"]) for m in messages)
            reply.tokens_in += usage[0] if usage[0] else max(1, prompt_chars // 4)
            reply.tokens_out += usage[1] if usage[1] else estimate_tokens(content or "")
            feedback = self._judge(reply, fmt, check)
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
        self, reply: LLMReply[M], fmt: ReplyFormat[M], check: Callable[[M], list[str]] | None
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
            reply.value = fmt.parse(data)
        except ValidationError as exc:
            reply.error = f"reply does not match the schema: {_describe_validation(exc)}"
            return (
                f"Your reply does not match the schema: {_describe_validation(exc)}. "
                "Reply again with a corrected JSON object."
            )
        except ValueError as exc:
            reply.error = f"reply does not match the schema: {exc}"
            return f"Your reply is not usable: {exc}. Reply again with a corrected JSON object."
        reply.parsed = True
        reply.error = None
        if check is not None:
            reply.violations = check(reply.value)
            if reply.violations:
                listed = "; ".join(f"({i}) {v}" for i, v in enumerate(reply.violations, 1))
                return (
                    f"Your decision is infeasible ({len(reply.violations)} problems): {listed}. "
                    "Reply again with a corrected JSON object that fixes every item."
                )
        return None

    def _create(
        self,
        messages: list[dict[str, str]],
        fmt: ReplyFormat[M],
        schema_name: str,
        mode: OutputMode,
        remaining_s: float,
    ) -> tuple[str | None, tuple[int | None, int | None]]:
        schema = fmt.schema
        response_format: dict[str, Any]
        sent = messages
        if mode == "json_schema":
            response_format = {
                "type": "json_schema",
                "json_schema": {"name": schema_name, "schema": schema, "strict": True},
            }
        elif mode == "json_object_schema":
            # llama.cpp's dialect: the server compiles the schema into a grammar, so the
            # prompt need not carry it.
            response_format = {"type": "json_object", "schema": schema}
        else:
            response_format = {"type": "json_object"}
            hint = (
                "\n\nReply with one JSON object (no prose, no code fence) valid against "
                f"this JSON Schema named {schema_name}:\n"
                + json.dumps(schema, separators=(",", ":"))
            )
            sent = [{"role": messages[0]["role"], "content": messages[0]["content"] + hint}]
            sent += messages[1:]
        temperature = (
            self.settings.temperature
            if self.settings.temperature is not None
            else DEFAULT_TEMPERATURE
        )
        raw = self._client.chat.completions.with_raw_response.create(  # type: ignore[call-overload]
            model=self.settings.model,
            messages=sent,
            response_format=response_format,
            max_tokens=fmt.max_tokens,
            temperature=temperature,
            timeout=max(0.01, min(self.settings.timeout_s, remaining_s)),
        )
        # The SDK builds its models without validation (a `str` for an HTML page,
        # `message=None` kept as is): read the body as plain JSON and check each step.
        try:
            body = _loads(raw.http_response.text.lstrip("\ufeff"))
        except ValueError as exc:
            ctype = raw.http_response.headers.get("content-type", "no content type")
            raise _BadBody(f"the body is not JSON ({ctype})") from exc
        return _completion_content(body), _usage(body)


def _msg(exc: openai.APIStatusError, limit: int = 200) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:limit]
    return str(exc)[:limit]


#: Words of an error answer that blame the output format rather than the prompt
#: (OpenAI, vLLM, llama.cpp, llama-cpp-python and Ollama phrasings).
_FORMAT_WORDS = ("response_format", "json_schema", "schema", "format", "guided")


def _about_output_format(exc: openai.APIStatusError) -> bool:
    # The whole message: llama-cpp-python's names the field in a pydantic dump.
    text = _msg(exc, limit=4000).lower()
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
