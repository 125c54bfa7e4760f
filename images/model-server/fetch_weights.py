"""Download one model's weights into the image at build time (never at run time).

Usage: python fetch_weights.py MODEL_ID REVISION TARGET_DIR

Only safetensors weights and the configuration/tokenizer files are kept: no
PyTorch pickles, Flax, TF, ONNX or half-precision duplicates, which keeps the
images small (the paper's storage figures: 7.5-17.5 GB per image).
"""

from __future__ import annotations

import sys

from huggingface_hub import snapshot_download

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
    snapshot_download(repo_id=model_id, revision=revision, local_dir=target, ignore_patterns=IGNORE)
    print(f"fetched {model_id}@{revision} into {target}")


if __name__ == "__main__":
    main()
