"""Download one model's weights into the image at build time (never at run time).

Usage: python fetch_weights.py MODEL_ID REVISION TARGET_DIR

MODEL_ID `local:<name>` copies /weights/<name> (images/model-server/weights/<name>
in the build context) instead: weights fetched beforehand, or a build with no
access to the hub.

Only safetensors weights and the configuration/tokenizer files are kept: no
PyTorch pickles, Flax, TF, ONNX or half-precision duplicates, which keeps the
images small (the paper's storage figures: 7.5-17.5 GB per image).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

IGNORE = [
    "*.bin",
    "*.ckpt",
    "*.pt",
    "*.h5",
    "*.msgpack",
    "*.onnx",
    "*.onnx_data",
    "*.ot",
    "*.tflite",
    "*fp16*",
    "*.md",
    ".gitattributes",
]


def main() -> None:
    model_id, revision, target = sys.argv[1:4]
    if model_id.startswith("local:"):
        source = Path("/weights") / model_id.removeprefix("local:")
        if not (source / "config.json").is_file() and not (source / "model_index.json").is_file():
            sys.exit(f"fetch_weights: {source} holds no model (no config.json or model_index.json)")
        shutil.copytree(source, target)
        print(f"copied local weights {source} into {target}")
        return
    from huggingface_hub import snapshot_download

    snapshot_download(repo_id=model_id, revision=revision, local_dir=target, ignore_patterns=IGNORE)
    print(f"fetched {model_id}@{revision} into {target}")


if __name__ == "__main__":
    main()
