"""Templated text-classification tasks for ``veil finetune`` (deterministic, generated, nothing downloaded).

- ``sentiment``: "the {noun} was {adj}." with positive / negative adjectives; half the sentences insert a
  negation ("was not", "wasn't", "was hardly"), which flips the label — the frozen encoder's mean-pooled
  embedding mostly sees the adjective, so a linear probe struggles where an adapter learns the negation.
- ``number``: does the sentence mention a quantity (a digit string or a number word) or not.
- ``topic``: a 12-word window from one of four sections of Python's own reference (``pydoc_data.topics``:
  debugger, formatstrings, string-methods, try) — which section is it from.

Every task is a function of a seed; the same seed gives the same train / val / test split on any machine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NOUNS = ["movie", "meal", "hotel", "service", "concert", "book", "phone", "trip", "class", "game", "coffee", "show"]
POSITIVE = ["great", "wonderful", "excellent", "delightful", "superb", "pleasant", "fantastic", "lovely"]
NEGATIVE = ["terrible", "awful", "boring", "disappointing", "horrible", "dreadful", "bland", "poor"]
NEGATIONS = ["not", "never", "hardly", "far from"]
OPENERS = ["honestly,", "i think", "overall", "to be fair,", "in my view", "frankly,"]
NUMBER_WORDS = ["two", "three", "five", "seven", "twelve", "forty", "a hundred", "nine"]
THINGS = ["apples", "chairs", "emails", "birds", "tickets", "cars", "books", "songs"]
VAGUE = ["some", "many", "a few", "several", "no", "lots of", "plenty of", "enough"]
PLACES = ["in the box", "on the table", "at the station", "near the door", "in my bag", "on the list"]
TOPIC_SECTIONS = ["debugger", "formatstrings", "string-methods", "try"]


@dataclass(frozen=True)
class TaskData:
    """Texts and integer labels of one split."""

    texts: list[str]
    labels: list[int]


@dataclass(frozen=True)
class TextTask:
    """A generated task: its label names and three splits."""

    name: str
    label_names: list[str]
    train: TaskData
    val: TaskData
    test: TaskData


def _sentiment(rng: random.Random) -> tuple[str, int]:
    positive, negated = rng.random() < 0.5, rng.random() < 0.5
    adj = rng.choice(POSITIVE if positive else NEGATIVE)
    verb = f"was {rng.choice(NEGATIONS)}" if negated else "was"
    return f"{rng.choice(OPENERS)} the {rng.choice(NOUNS)} {verb} {adj}.", int(positive != negated)


def _number(rng: random.Random) -> tuple[str, int]:
    has_number = rng.random() < 0.5
    if has_number:
        amount = rng.choice([str(rng.randint(2, 999)), rng.choice(NUMBER_WORDS)])
    else:
        amount = rng.choice(VAGUE)
    return f"there were {amount} {rng.choice(THINGS)} {rng.choice(PLACES)}.", int(has_number)


def _topic_sampler():
    from pydoc_data.topics import topics

    words = {name: topics[name].split() for name in TOPIC_SECTIONS}

    def sample(rng: random.Random) -> tuple[str, int]:
        label = rng.randrange(len(TOPIC_SECTIONS))
        section = words[TOPIC_SECTIONS[label]]
        start = rng.randrange(len(section) - 12)
        return " ".join(section[start:start + 12]), label

    return sample


TASKS = {"sentiment": ["negative", "positive"], "number": ["no number", "number"], "topic": TOPIC_SECTIONS}


def make_task(name: str, sizes: tuple[int, int, int] = (480, 120, 240), seed: int = 0) -> TextTask:
    """Generate ``name`` with (train, val, test) sizes; duplicates across splits are removed from val and test.

    Raises:
        ValueError: ``name`` is not one of ``TASKS``.
    """
    if name not in TASKS:
        raise ValueError(f"task: expected one of {sorted(TASKS)}, received {name!r}")
    sampler = {"sentiment": _sentiment, "number": _number}.get(name) or _topic_sampler()
    rng = random.Random(f"veil-finetune-{name}-{seed}")
    train = [sampler(rng) for _ in range(sizes[0])]
    seen = {t for t, _ in train}
    held: list[tuple[str, int]] = []
    for _ in range(50 * (sizes[1] + sizes[2])):
        if len(held) == sizes[1] + sizes[2]:
            break
        text, label = sampler(rng)
        if text not in seen:
            seen.add(text)
            held.append((text, label))

    def split(rows: list[tuple[str, int]]) -> TaskData:
        return TaskData([t for t, _ in rows], [y for _, y in rows])

    return TextTask(name, TASKS[name], split(train), split(held[:sizes[1]]), split(held[sizes[1]:]))
