"""A small generated English-like corpus for the character-level language model.

A template grammar writes short stories (one to eight sentences, one story per line) from word lists, with a
private ``random.Random(seed)``: the corpus is offline, deterministic, and its lines vary widely in length.
This module needs neither torch nor numpy, so ``python -m course_lib data prepare`` stays quick.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from course_lib import atomic, mode

TEXT_SIZES = {"smoke": (300, 60), "full": (6000, 600)}  # lines (stories) in train, val
FORMAT_VERSION = 1

_NAMES = ["Ada", "Ben", "Cleo", "Dev", "Esme", "Finn", "Gita", "Hugo", "Iris", "Jon", "Kai", "Lena", "Milo", "Nora"]
_ANIMALS = ["cat", "dog", "fox", "owl", "goat", "heron", "otter", "crow", "mole", "hare"]
_ADJECTIVES = ["small", "brave", "sleepy", "clever", "quiet", "curious", "old", "tiny", "grumpy", "happy"]
_PLACES = ["the forest", "the river", "the old mill", "the market", "the hill", "the garden", "the harbour",
           "the library", "the bakery", "the station"]
_OBJECTS = ["a red kite", "a lost key", "a map", "three apples", "a lantern", "a blue stone", "a letter",
            "an umbrella", "a loaf of bread", "a wooden box"]
_VERBS = ["found", "carried", "hid", "painted", "shared", "dropped", "counted", "buried", "mended", "sold"]
_MOVES = ["walked to", "ran to", "sailed to", "climbed up to", "wandered to", "hurried to"]
_TIMES = ["One morning", "At dusk", "Later", "On Monday", "After the rain", "Before dawn", "That evening"]
_FEELINGS = ["laughed", "sighed", "sang a song", "fell asleep", "felt proud", "was very surprised"]
_ENDINGS = ["The end.", "And that was that.", "Nobody ever knew why.", "It was a good day.", "They went home."]


def _character(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(_NAMES)
    return f"the {rng.choice(_ADJECTIVES)} {rng.choice(_ANIMALS)}"


def _sentence(rng: random.Random, who: str) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        s = f"{who} {rng.choice(_MOVES)} {rng.choice(_PLACES)}"
    elif kind == 1:
        s = f"{who} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} near {rng.choice(_PLACES)}"
    elif kind == 2:
        s = f"{rng.choice(_TIMES)}, {who} {rng.choice(_FEELINGS)}"
    elif kind == 3:
        s = f"{who} met {_character(rng)} and they {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
    else:
        n = rng.randint(2, 9)
        s = f"{who} {rng.choice(_VERBS)} {n} {rng.choice(['stones', 'shells', 'coins', 'feathers'])}"
    return s[0].upper() + s[1:] + rng.choice([".", ".", ".", "!"])


def generate_story(rng: random.Random) -> str:
    """One line of text: a story of 1 to 8 sentences (so lengths vary from ~20 to ~400 characters)."""
    hero = _character(rng)
    n = rng.choice([1, 1, 2, 2, 3, 4, 5, 6, 8])
    sentences = [_sentence(rng, hero if i == 0 or rng.random() < 0.6 else "they") for i in range(n)]
    if n > 2 and rng.random() < 0.5:
        sentences.append(rng.choice(_ENDINGS))
    return " ".join(sentences)


def generate_text(root: str | Path, *, n_train: int, n_val: int, seed: int = 0) -> Path:
    """Write ``train.txt`` and ``val.txt`` (one story per line) under ``root``; idempotent (``meta.json`` last)."""
    for name, value in (("n_train", n_train), ("n_val", n_val)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"generate_text: {name}={value!r} must be an int >= 1.")
    root = Path(root)
    params = {"format": FORMAT_VERSION, "n_train": n_train, "n_val": n_val, "seed": int(seed)}
    meta_path = root / "meta.json"
    if meta_path.is_file() and json.loads(meta_path.read_text()).get("params") == params:
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)  # a private generator: the global `random` state is untouched
    for split, n in (("train", n_train), ("val", n_val)):
        lines = [generate_story(rng) for _ in range(n)]
        # Atomically: readers (and a concurrent writer of the same content) only ever see a whole file.
        atomic.write_text(root / f"{split}.txt", "\n".join(lines) + "\n")
    atomic.write_text(meta_path, json.dumps({"params": params}, indent=2))  # last: marks the corpus complete
    return root


def text_root(root: str | Path | None = None) -> Path:
    """Where the text for the current mode lives: ``data_dir()/text-<mode>`` unless ``root`` is given."""
    return Path(root) if root is not None else mode.data_dir() / f"text-{mode.mode()}"


def prepare_text(root: str | Path | None = None) -> Path:
    """Generate the mode-sized corpus if needed (instant when done)."""
    n_train, n_val = TEXT_SIZES[mode.mode()]
    return generate_text(text_root(root), n_train=n_train, n_val=n_val, seed=0)
