"""The model server's HTTP surface: one LM per pod, one prompt set at a time.

* `POST /infer`: run a prompt set (`lmedge.api.inference.InferRequest`),
  resuming at the first unfinished prompt of a set seen before a restart;
* `GET /healthz`: the process is up; `GET /readyz`: the weights are loaded
  and the progress directory is writable (503 with the reason otherwise —
  the gateway keeps retrying, which is the cold start). Without a writable
  progress directory every set would fail, so such a pod must never look
  ready: the directory is probed with a real write before the weights load
  and at every readiness check;
* `GET /metrics`: prompts run, prompt time, sets by outcome.

Weights load in a thread after the server starts listening, so the readiness
probe, not the liveness probe, covers the slow part.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from lmedge.api.inference import InferRequest, InferResult
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

    @app.post("/infer", response_model=InferResult)
    async def infer(body: InferRequest) -> JSONResponse | InferResult:
        if not server.ready.is_set():
            return JSONResponse(
                {"detail": server.load_error or "model is loading"}, status_code=503
            )
        if body.lm != server.lm:
            return JSONResponse(
                {"detail": f"this pod serves {server.lm!r}, not {body.lm!r}"}, status_code=404
            )
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
