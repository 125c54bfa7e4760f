"""Write a tiny GPT-2 with random weights (and its tokenizer) into DIR.

The model-server image of the real-node tier bakes it in as its "weights", so
`make images` never downloads a model. It is the same model the model-server
integration tests make (tests/integration/test_modelserver.py::tiny_gpt2).

Usage: python tools/realnode/tiny_gpt2.py DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.integration.test_modelserver import tiny_gpt2


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: tiny_gpt2.py DIR", file=sys.stderr)
        return 2
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    tiny_gpt2(target)
    print(f"tiny GPT-2 written to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
