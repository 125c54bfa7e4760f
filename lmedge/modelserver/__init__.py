"""The model server: one LM per pod, serving prompt sets for its node's gateway.

`backends` turns one prompt into one output (a deterministic stub, or GPT-2 /
BLIP / Stable Diffusion through transformers and diffusers, whose imports are
deferred to `hf` so the control plane never needs torch); `progress` keeps the
finished prompts of each set on a host path so a restarted pod resumes without
repeating one; `app` is the FastAPI surface (`/infer`, `/healthz`, `/readyz`,
`/metrics`). The wire contract is `lmedge.api.inference`.
"""
