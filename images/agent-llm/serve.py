"""The agent-llm image's entrypoint: llama-cpp-python's OpenAI server, spoken to as the chart does.

The chart's `agentLLM` Deployment passes llama.cpp server options (`--model`,
`--alias`, `--ctx-size`, `--parallel`, `--chat-template`, `--n-gpu-layers`,
`--host`, `--port`, extra `--threads`) and probes `GET /health`. This image
serves with llama-cpp-python instead (the same server the test suite and
`make simulate-llm` run), so this script maps those options onto its
settings and adds the `/health` route its app lacks. An option it does not
know is an error naming it, never silently dropped.

`--parallel` is accepted and logged: llama-cpp-python serves one request at
a time (the agents detect its dialect and serialise their calls to it).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

#: llama.cpp template names the chart may give, and llama-cpp-python's formats for them.
CHAT_FORMATS = {"chatml": "chatml", "gemma": "gemma", "llama2": "llama-2", "llama3": "llama-3"}


def parser() -> argparse.ArgumentParser:
    """The options the chart's agent-llm container passes (llama.cpp server names)."""
    p = argparse.ArgumentParser(prog="agent-llm", allow_abbrev=False)
    p.add_argument("--model", "-m", required=True, help="GGUF file.")
    p.add_argument("--alias", default=None, help="Model name the agents send.")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--ctx-size", "-c", type=int, default=8192, dest="ctx_size")
    p.add_argument("--parallel", "-np", type=int, default=1)
    p.add_argument("--chat-template", default=None, dest="chat_template")
    p.add_argument("--n-gpu-layers", "-ngl", type=int, default=0, dest="n_gpu_layers")
    p.add_argument("--threads", "-t", type=int, default=None)
    return p


def settings_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """llama-cpp-python `ModelSettings` fields for the parsed options."""
    threads = args.threads or os.cpu_count() or 1
    kwargs: dict[str, object] = {
        "model": args.model,
        "model_alias": args.alias,
        "n_ctx": args.ctx_size,
        "n_gpu_layers": args.n_gpu_layers,
        "n_threads": threads,
        "n_threads_batch": threads,
        "verbose": False,
    }
    if args.chat_template:
        if args.chat_template not in CHAT_FORMATS:
            known = ", ".join(sorted(CHAT_FORMATS))
            raise SystemExit(f"agent-llm: --chat-template {args.chat_template!r}: one of {known}")
        kwargs["chat_format"] = CHAT_FORMATS[args.chat_template]
    return kwargs


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if not os.path.isfile(args.model):
        raise SystemExit(f"agent-llm: no model file at {args.model}")
    # Imported here: parsing (and its test) needs no llama.cpp.
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    if args.parallel > 1:
        print(
            f"agent-llm: --parallel {args.parallel}: requests are served one at a time",
            file=sys.stderr,
        )
    app = create_app(
        server_settings=ServerSettings(host=args.host, port=args.port),
        model_settings=[ModelSettings(**settings_kwargs(args))],
    )

    @app.get("/health")
    def health() -> dict[str, str]:  # the chart's readiness and liveness probes
        return {"status": "ok"}

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
