#!/bin/sh
# Start the model server for the LM baked into this image. Extra arguments
# (e.g. --device cpu, --max-new-tokens 64) are passed through.
# LMEDGE_STUB_SECONDS (build arg STUB_SECONDS) sets the stub backend's time per prompt.
set -eu
if [ -n "${LMEDGE_STUB_SECONDS:-}" ]; then
  set -- --stub-seconds "${LMEDGE_STUB_SECONDS}" "$@"
fi
exec lmedge model-server \
  --host 0.0.0.0 --port 8000 \
  --lm "${LMEDGE_LM}" --modality "${LMEDGE_MODALITY}" --backend "${LMEDGE_BACKEND}" \
  --model-path /models/model --progress-dir /var/lib/lmedge/progress \
  "$@"
