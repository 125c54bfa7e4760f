"""The scored-prompt dataset CEMA's quality store is built from: a seeded generator.

Why a generator: the paper profiles GSM8K/MMLU prompts on its endpoints and
scores the answers by exact match. lmedge cannot download those sets, and the
only model it can run offline (the gemma-3-270m GGUF of `make tools`) is one
column, not a catalogue. So the prompts are real text generated from
templates in three task families, and each (prompt, model) score comes from a
latent-skill model (item response theory), seeded:

    p(m, x) = sigmoid(a_f * (theta_m + delta_{m,f} - d_x))

- theta_m: the model's skill (`MODELS`), delta_{m,f} ~ N(0, 0.3) a seeded
  per-(model, family) specialization, so rankings differ by family;
- d_x: the prompt's difficulty, the family's base plus what the text shows
  (arithmetic: one step more +0.5, numbers above 100 +0.3; choice: the
  topic's offset; summary: +0.2 a sentence) plus N(0, 0.3) noise;
- a_f: the family's discrimination (`FAMILIES`).

`arithmetic` and `choice` are scored by exact match, so the score is a
Bernoulli(p) draw (0 or 1); `summary` has a graded score (like ROUGE):
p + N(0, 0.05), clipped to [0, 1]. Every prompt carries its reference answer.
A seed gives the same rows byte for byte (`dumps`); the committed file
`data/quality-prompts.jsonl` is `generate(0)` (`lmedge cema make-dataset`).
Rows are split 80/20 into `profile` (what the store indexes) and `workload`
(prompts a run may send, never in the index).

What it is not: a measurement of any real model. The model names say so
(`latent-*`); map lmedge LMs onto them with the router's `store_models`.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lmedge.errors import ConfigError

#: The committed dataset, `generate(0)`.
DATA_FILE = Path(__file__).parent / "data" / "quality-prompts.jsonl"

#: Latent skill theta_m of each store model, smallest first.
MODELS: dict[str, float] = {
    "latent-0.3b": -1.0,
    "latent-1b": -0.2,
    "latent-3b": 0.5,
    "latent-8b": 1.1,
    "latent-30b": 1.7,
    "latent-70b": 2.2,
}

#: (base difficulty, discrimination a_f, scoring) per family.
FAMILIES: dict[str, tuple[float, float, str]] = {
    "arithmetic": (0.8, 1.6, "exact"),
    "choice": (0.2, 1.2, "exact"),
    "summary": (-0.5, 0.8, "graded"),
}

Split = Literal["profile", "workload"]


class ScoredPrompt(BaseModel):
    """One prompt with its reference answer and its score at every store model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="Family and ordinal, e.g. arithmetic-0007.")
    family: str
    split: Split
    prompt: str
    answer: str = Field(description="Reference answer (exact-match families) or summary.")
    difficulty: float = Field(description="d_x of the latent-skill model.")
    scores: dict[str, float] = Field(description="Score in [0, 1] per store model.")


_NAMES = ["Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas"]
_ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "coins", "cards", "shells"]


def _arithmetic(rng: random.Random) -> tuple[str, str, float]:
    name, other = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    big = rng.random() < 0.3
    n = rng.randint(100, 900) if big else rng.randint(5, 60)
    steps = rng.randint(1, 4)
    text = [f"{name} has {n} {item}."]
    for _ in range(steps):
        op = rng.choice(["buy", "give", "double", "share"])
        if op == "buy":
            k = rng.randint(2, 40)
            n += k
            text.append(f"Then {name} buys {k} more {item}.")
        elif op == "give" and n > 2:
            k = rng.randint(1, n - 1)
            n -= k
            text.append(f"Then {name} gives {k} {item} to {other}.")
        elif op == "share" and n % 2 == 0:
            n //= 2
            text.append(f"Then {name} shares them equally with {other} and keeps half.")
        else:
            n *= 2
            text.append(f"Then {name} doubles the {item}.")
    text.append(f"How many {item} does {name} have now? Answer with a number.")
    return " ".join(text), str(n), 0.5 * (steps - 1) + (0.3 if big else 0.0)


_CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima",
    "Canada": "Ottawa", "Egypt": "Cairo", "Norway": "Oslo", "Chile": "Santiago",
    "Vietnam": "Hanoi", "Poland": "Warsaw", "Ghana": "Accra", "Cuba": "Havana",
}  # fmt: skip
_SYMBOLS = {
    "sodium": "Na", "iron": "Fe", "gold": "Au", "potassium": "K", "silver": "Ag",
    "lead": "Pb", "tin": "Sn", "mercury": "Hg", "copper": "Cu", "tungsten": "W",
}  # fmt: skip
_EVENTS = {
    "the fall of the Western Roman Empire": "5th", "the signing of Magna Carta": "13th",
    "the first voyage of Columbus": "15th", "the French Revolution": "18th",
    "the Battle of Hastings": "11th", "the Peace of Westphalia": "17th",
    "the invention of the printing press by Gutenberg": "15th",
}  # fmt: skip
_ORGANS = {
    "filters blood to produce urine": "kidney", "pumps blood through the body": "heart",
    "produces bile": "liver", "exchanges oxygen and carbon dioxide": "lung",
    "produces insulin": "pancreas", "stores bile": "gallbladder",
}  # fmt: skip
#: topic -> difficulty offset
_TOPICS = {"geography": -0.4, "biology": -0.1, "chemistry": 0.3, "history": 0.5, "physics": 0.7}


def _choice(rng: random.Random) -> tuple[str, str, float]:
    topic = rng.choice(list(_TOPICS))
    if topic == "geography":
        country = rng.choice(list(_CAPITALS))
        question, right = f"What is the capital of {country}?", _CAPITALS[country]
        pool = list(_CAPITALS.values())
    elif topic == "chemistry":
        element = rng.choice(list(_SYMBOLS))
        question, right = f"What is the chemical symbol of {element}?", _SYMBOLS[element]
        pool = list(_SYMBOLS.values())
    elif topic == "history":
        event = rng.choice(list(_EVENTS))
        question, right = f"In which century did {event} take place?", _EVENTS[event]
        pool = [f"{c}th" for c in range(4, 20)]
    elif topic == "biology":
        role = rng.choice(list(_ORGANS))
        question, right = f"Which organ {role}?", _ORGANS[role]
        pool = list(_ORGANS.values())
    else:
        v, t = rng.randint(2, 30), rng.randint(2, 12)
        question = f"A cart moves at a constant {v} m/s for {t} s. How far does it travel?"
        right = f"{v * t} m"
        pool = [f"{v * t + d} m" for d in (-2 * v, -v, v, 2 * v, v + t)]
    options = [right, *rng.sample(sorted(set(pool) - {right}), 3)]
    rng.shuffle(options)
    letters = "ABCD"
    lines = " ".join(f"({letters[i]}) {o}" for i, o in enumerate(options))
    prompt = f"[{topic}] {question} {lines} Answer with the letter."
    return prompt, letters[options.index(right)], _TOPICS[topic]


_CITIES = ["Bristol", "Leeds", "Porto", "Lyon", "Turin", "Graz", "Aarhus", "Ghent"]
_BODIES = ["the city council", "a local charity", "the university", "the transport authority"]
_PROJECTS = ["a new cycle lane", "a flood barrier", "a public library", "a solar farm"]
_DETAILS = [
    "Work is expected to take {n} months.",
    "About {n} residents attended the first public meeting.",
    "The plan was first proposed {n} years ago.",
    "Critics say the budget could rise by {n} percent.",
    "Supporters expect {n} new jobs during construction.",
]


def _summary(rng: random.Random) -> tuple[str, str, float]:
    city, body, project = rng.choice(_CITIES), rng.choice(_BODIES), rng.choice(_PROJECTS)
    cost = rng.randint(2, 90)
    lead = f"In {city}, {body} approved {project} costing {cost} million euros."
    extra = rng.sample(_DETAILS, rng.randint(1, 4))
    body_text = " ".join([lead, *(d.format(n=rng.randint(2, 400)) for d in extra)])
    prompt = f"Summarize the following news in one sentence. {body_text}"
    return prompt, f"{city} approved {project} for {cost} million euros.", 0.2 * len(extra)


_MAKERS = {"arithmetic": _arithmetic, "choice": _choice, "summary": _summary}


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def generate(
    seed: int = 0, per_family: int = 240, workload_share: float = 0.2
) -> list[ScoredPrompt]:
    """The dataset for a seed: `per_family` prompts a family, scored at every `MODELS` entry."""
    rng = random.Random(seed)
    special = {(m, f): rng.gauss(0.0, 0.3) for m in MODELS for f in FAMILIES}
    rows: list[ScoredPrompt] = []
    for family, (base, discrimination, scoring) in FAMILIES.items():
        for k in range(per_family):
            prompt, answer, shown = _MAKERS[family](rng)
            d = base + shown + rng.gauss(0.0, 0.3)
            scores: dict[str, float] = {}
            for m, theta in MODELS.items():
                p = _sigmoid(discrimination * (theta + special[(m, family)] - d))
                if scoring == "exact":
                    scores[m] = 1.0 if rng.random() < p else 0.0
                else:
                    scores[m] = round(min(1.0, max(0.0, p + rng.gauss(0.0, 0.05))), 3)
            split: Split = "workload" if rng.random() < workload_share else "profile"
            rows.append(
                ScoredPrompt(
                    id=f"{family}-{k:04d}",
                    family=family,
                    split=split,
                    prompt=prompt,
                    answer=answer,
                    difficulty=round(d, 4),
                    scores=scores,
                )
            )
    return rows


def dumps(rows: Iterable[ScoredPrompt]) -> str:
    """JSON lines, one row each, fields and models in order (the committed file's format)."""
    return "".join(json.dumps(r.model_dump()) + "\n" for r in rows)


def load(path: Path = DATA_FILE) -> list[ScoredPrompt]:
    """The rows of a JSON-lines dataset; a bad row is a `ConfigError` naming its line."""
    rows = []
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cema dataset {path}: {exc.strerror}") from exc
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(ScoredPrompt.model_validate_json(line))
        except ValueError as exc:
            raise ConfigError(f"cema dataset {path}:{n}: {exc}") from exc
    return rows
