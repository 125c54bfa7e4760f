"""The model server's HTTP surface: one LM per pod, one prompt set at a time.

* `POST /infer`: run a prompt set (`lmedge.api.inference.InferRequest`),
  resuming at the first unfinished prompt of a set seen before a restart;
* `GET /healthz`: the process is up; `GET /readyz`: the weights are loaded
  and the progress directory is writable (503 with the reason otherwise —
  the gateway keeps retrying, which is the cold start). Without a writable
  progress directory every set would fail, so such a pod must never look
  ready: the directory is probed with a real write before the weights load
  and at every readiness check;
* `POST /infer/stream`: run one prompt (an `InferRequest` of exactly one),
  answering server-sent events of `lmedge.api.inference.StreamChunk` as the
  backend produces text: `data: {"text": ...}` pieces, then one with `done`
  and the token counts and compute time, or one with `error` if the backend
  fails after the first piece. A prompt the model cannot take (too long for
  its context, no image) is refused with 422 before any event. A stream takes
  the pod like a set does (one at a time); a client that disconnects stops
  the generation at the next piece and frees the pod. Streams keep no
  progress file: a stream cut by a restart cannot be resumed (its client
  already holds the first pieces), the gateway records it as failed;
* `GET /metrics`: prompts run, prompt time, sets by outcome.

Weights load in a thread after the server starts listening, so the readiness
probe, not the liveness probe, covers the slow part.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Generator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from lmedge.api.inference import InferRequest, InferResult, Output, Prompt, StreamChunk
from lmedge.modelserver.backends import Backend
from lmedge.modelserver.progress import ProgressLog

__all__ = ["ModelServer", "create_app"]

log = logging.getLogger(__name__)


@dataclass
class _Metrics:
    registry: CollectorRegistry
    prompts: Counter
    prompt_seconds: Histogram
    sets: Counter
    resumed: Counter


def _metrics(lm: str) -> _Metrics:
    registry = CollectorRegistry(auto_describe=True)
    return _Metrics(
        registry=registry,
        prompts=Counter(
            "lmedge_model_prompts", "Prompts run by this process.", ["lm"], registry=registry
        ),
        prompt_seconds=Histogram(
            "lmedge_model_prompt_seconds",
            "Compute time of one prompt.",
            ["lm"],
            registry=registry,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        ),
        sets=Counter(
            "lmedge_model_sets",
            "Prompt sets answered, by outcome.",
            ["lm", "outcome"],
            registry=registry,
        ),
        resumed=Counter(
            "lmedge_model_resumed_prompts",
            "Prompts found finished by an earlier process.",
            ["lm"],
            registry=registry,
        ),
    )


class ModelServer:
    """Runs prompt sets on one backend, persisting progress under `progress_dir`."""

    def __init__(
        self, lm: str, backend: Backend, progress_dir: Path, *, fsync: bool = True
    ) -> None:
        self.lm = lm
        self.fsync = fsync
        self.backend = backend
        self.progress_dir = progress_dir
        self.metrics = _metrics(lm)
        self.ready = threading.Event()
        self.load_error: str | None = None
        # One set at a time per pod: the gateway's FIFO queue feeds it in order.
        # The thread lock also covers a set still finishing after its caller left.
        self.busy = asyncio.Lock()
        self._running = threading.Lock()

    def progress_problem(self) -> str | None:
        """Why progress cannot be persisted (the directory is not writable), or None.

        A real create-write-delete probe, not `os.access`: it also catches a
        read-only mount, a full disk and a root-owned hostPath as uid 10001.
        """
        probe = self.progress_dir / f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            self.progress_dir.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as exc:
            return f"progress directory {self.progress_dir} is not writable: {exc.strerror or exc}"
        return None

    def load(self) -> None:
        problem = self.progress_problem()
        if problem is not None:
            # Loading weights would only hide it: every set would answer 500.
            log.error("%s: not ready: %s", self.lm, problem)
            self.load_error = problem
            return
        try:
            self.backend.load()
        except Exception as exc:  # shown on /readyz and in the log; the pod never turns ready
            log.exception("loading the model of %s failed", self.lm)
            self.load_error = f"{type(exc).__name__}: {exc}"
            return
        self.ready.set()

    def run_set(self, request: InferRequest) -> InferResult:
        """Run the prompts not yet finished; stop starting new ones after the budget."""
        with self._running:
            return self._run_set(request)

    def stream_prompt(
        self, prompt: Prompt, cancel: threading.Event
    ) -> Generator[Output, None, None]:
        """The backend's pieces for one prompt; stops at the next piece once `cancel` is set."""
        with self._running:
            pieces = self.backend.stream(prompt)
            try:
                for piece in pieces:
                    yield piece
                    if cancel.is_set():
                        return
            finally:
                pieces.close()  # stop generating now
            self.metrics.prompts.labels(lm=self.lm).inc()

    def _run_set(self, request: InferRequest) -> InferResult:
        start = time.monotonic()
        log_ = ProgressLog(self.progress_dir, request.id, list(request.prompts), fsync=self.fsync)
        done = log_.open()
        resumed = len(done)
        if resumed:
            self.metrics.resumed.labels(lm=self.lm).inc(resumed)
        for index, prompt in enumerate(request.prompts):
            if index in done:
                continue
            if request.budget_s is not None and time.monotonic() - start >= request.budget_s:
                break
            began = time.perf_counter()
            output = self.backend.run(prompt)
            seconds = time.perf_counter() - began
            log_.record(index, output, seconds)
            done[index] = log_.done[index]
            self.metrics.prompts.labels(lm=self.lm).inc()
            self.metrics.prompt_seconds.labels(lm=self.lm).observe(seconds)
        outputs = []
        for index in range(len(request.prompts)):
            if index not in done:
                break
            outputs.append(done[index].output)
        complete = len(outputs) == len(request.prompts)
        if complete:
            log_.remove()
        self.metrics.sets.labels(lm=self.lm, outcome="complete" if complete else "partial").inc()
        return InferResult(
            id=request.id,
            lm=request.lm,
            outputs=outputs,
            complete=complete,
            inference_s=sum(d.seconds for d in done.values()),
            mode=self.backend.mode,
            resumed_from=resumed,
        )


def create_app(server: ModelServer, *, load_in_background: bool = True) -> FastAPI:
    """The model server's ASGI app; starts loading the weights at startup."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if load_in_background:
            threading.Thread(target=server.load, name="model-load", daemon=True).start()
        else:
            server.load()
        yield

    app = FastAPI(title=f"lmedge model server ({server.lm})", version="0.1.0", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes each bad input, and an input that cannot be
        # encoded (a lone UTF-16 surrogate) turned the 422 into a 500.
        errors = [
            {"loc": e.get("loc"), "msg": e.get("msg"), "type": e.get("type")} for e in exc.errors()
        ]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        loaded = server.ready.is_set()
        # Probed while loading too, so an unwritable directory is the first reason shown.
        problem = await asyncio.to_thread(server.progress_problem)
        if loaded and problem is None:
            return JSONResponse({"status": "ready", "lm": server.lm, "mode": server.backend.mode})
        detail = problem or server.load_error or "loading model"
        return JSONResponse({"status": "not ready", "detail": detail}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(
            generate_latest(server.metrics.registry), media_type="text/plain; version=0.0.4"
        )

    def refusal(body: InferRequest) -> JSONResponse | None:
        if not server.ready.is_set():
            return JSONResponse(
                {"detail": server.load_error or "model is loading"}, status_code=503
            )
        if body.lm != server.lm:
            return JSONResponse(
                {"detail": f"this pod serves {server.lm!r}, not {body.lm!r}"}, status_code=404
            )
        return None

    @app.post("/infer/stream")
    async def infer_stream(body: InferRequest) -> Response:
        refused = refusal(body)
        if refused is not None:
            return refused
        if len(body.prompts) != 1:
            return JSONResponse(
                {"detail": f"a stream runs exactly one prompt, got {len(body.prompts)}"},
                status_code=422,
            )
        events = _stream_events(server, body.prompts[0])
        first = await anext(events)  # the first piece, or why there is none
        if isinstance(first, JSONResponse):
            await events.aclose()
            return first
        # Only bytes follow the first item.
        return StreamingResponse(cast(AsyncIterator[bytes], events), media_type="text/event-stream")

    @app.post("/infer", response_model=InferResult)
    async def infer(body: InferRequest) -> JSONResponse | InferResult:
        refused = refusal(body)
        if refused is not None:
            return refused
        async with server.busy:
            try:
                return await asyncio.to_thread(server.run_set, body)
            except ValueError as exc:  # a prompt the model cannot take (e.g. no image)
                return JSONResponse({"detail": str(exc)}, status_code=422)
            except OSError as exc:  # progress not persisted: retryable once fixed (503)
                log.error("%s: set %s: cannot persist progress: %s", server.lm, body.id, exc)
                return JSONResponse(
                    {"detail": f"cannot persist progress in {server.progress_dir}: {exc}"},
                    status_code=503,
                )

    return app


_END = object()


async def _stream_events(
    server: ModelServer, prompt: Prompt
) -> AsyncGenerator[JSONResponse | bytes | None, None]:
    """Take the pod, run `prompt` in a thread, and yield its SSE events.

    The first item is None when the first piece is there (the stream can start)
    or the error response to send instead; then the events as bytes. The pod
    is held until this generator ends, is closed, or is cancelled (the client
    left): the generating thread stops at its next piece.
    """
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[object] = asyncio.Queue()
    cancel = threading.Event()

    def put(item: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed under a late piece
            loop.call_soon_threadsafe(pieces.put_nowait, item)

    def produce() -> None:
        began = time.perf_counter()
        try:
            for piece in server.stream_prompt(prompt, cancel):
                put(piece)
        except Exception as exc:
            put(exc)
        put((_END, time.perf_counter() - began))

    async with server.busy:
        worker = threading.Thread(target=produce, name="model-stream", daemon=True)
        worker.start()
        try:
            item = await pieces.get()
            if isinstance(item, ValueError):  # a prompt the model cannot take
                yield JSONResponse({"detail": str(item)}, status_code=422)
                return
            if isinstance(item, Exception):
                log.error("%s: stream failed before its first piece: %s", server.lm, item)
                yield JSONResponse({"detail": f"{type(item).__name__}: {item}"}, status_code=500)
                return
            yield None
            last = Output()
            while True:
                if isinstance(item, Exception):
                    log.error("%s: stream failed: %s", server.lm, item)
                    yield _sse(StreamChunk(error=f"{type(item).__name__}: {item}"))
                    return
                if isinstance(item, tuple) and item[0] is _END:
                    yield _sse(
                        StreamChunk(
                            done=True,
                            prompt_tokens=last.prompt_tokens,
                            completion_tokens=last.completion_tokens,
                            inference_s=item[1],
                            mode=server.backend.mode,
                        )
                    )
                    return
                if isinstance(item, Output):
                    if item.text:
                        yield _sse(StreamChunk(text=item.text))
                    if item.prompt_tokens is not None or item.completion_tokens is not None:
                        last = item
                item = await pieces.get()
        finally:
            cancel.set()


def _sse(chunk: StreamChunk) -> bytes:
    return b"data: " + chunk.model_dump_json(exclude_defaults=True).encode() + b"\n\n"
