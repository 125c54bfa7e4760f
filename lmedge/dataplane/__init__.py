"""The data plane: one gateway per worker node (paper §V-E, Fig. 4, T2.1-T2.12).

A prompt set submitted at a node's gateway is sent along the slot's routing map
to the destination node's gateway, waits there in a FIFO queue per LM for the
LM's local model pod (`lmedge.modelserver`), and its result returns to the
origin, which stores a `RequestRecord` with the uplink, queue (including cold
start), inference and downlink times.

A request with `stream: true` goes the same way piece by piece (server-sent
events at every hop) and its record adds TTFT, TPOT, tokens and the prefill /
decode split of inference.

Modules, from the core outwards: `routing` (the map as one node sees it),
`queues` (destination side), `windows` (request-level routing: the run's
router on windows of this node's requests, when the push asks for it),
`timing` (stage split and record), `sse` (the
event format), `engines` (one adapter per model-pod protocol), `gateway`
(both roles, no web framework), `records` (the store sink), `metrics`
(Prometheus), `openai` (OpenAI-compatible shapes and chunks), `clients`
(httpx), `app` (FastAPI). Only `clients` imports httpx.
"""
