"""Story infilling items (paper §4.5, App. C; docs/faithfulness.md#birdie-evaluations): a story of 3–7 numbered
events, one of them "(blank)", and four choices (A)–(D) for the blank, one of them right.

The paper's data set is not published, so items come from a local JSONL file, one item per line:

    {"events": ["Ellie gets a letter.", "(blank)", "She sails to the island."],
     "choices": ["She burns it.", "It holds a map.", "She moves away.", "She buys a car."],
     "answer": 1}

``answer`` (or ``label``) is the index 0–3 of the right choice, or its letter "A"–"D". Blank lines are
skipped. ``synthetic_items`` makes templated items (for tests and demos), ``write_jsonl`` writes a file.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ssmlm.errors import DataError

BLANK = "(blank)"
LETTERS = "ABCD"
MIN_EVENTS, MAX_EVENTS = 3, 7

# the paper's wording (App. C, Figures 4 and 5)
INSTRUCTION = "Consider the following sequence of events, then select a choice that best fills in the missing entry:"
QUESTION = "Which choice best fills in the missing entry?"


@dataclass(frozen=True)
class InfillingItem:
    events: tuple[str, ...]  # exactly one is BLANK
    choices: tuple[str, ...]  # four
    answer: int  # index of the right choice

    @property
    def blank(self) -> int:
        return self.events.index(BLANK)


def prompt(item: InfillingItem) -> str:
    """The item as the paper shows it: instruction, numbered events, "Choices:" (A)–(D), the question."""
    events = "\n".join(f"{i}. {e}" for i, e in enumerate(item.events, 1))
    choices = "\n".join(f"({LETTERS[i]}) {c}" for i, c in enumerate(item.choices))
    return f"{INSTRUCTION}\n\n{events}\n\nChoices:\n{choices}\n\n{QUESTION}"


def option(item: InfillingItem, i: int) -> str:
    """Choice i as the paper's label spells the answer: "(D) The letter leads her to an uncharted island."."""
    return f"({LETTERS[i]}) {item.choices[i]}"


def parse_item(raw, where: str) -> InfillingItem:
    """One item from its decoded JSON; DataError naming ``where`` (FILE:LINE) and the field otherwise."""
    if not isinstance(raw, dict):
        raise DataError(f"{where}: expected a JSON object with events, choices and answer; got {type(raw).__name__}")
    events, choices = raw.get("events"), raw.get("choices")
    if not isinstance(events, list) or not all(isinstance(e, str) and e.strip() for e in events):
        raise DataError(f"{where}: 'events' must be a list of non-empty strings")
    if not MIN_EVENTS <= len(events) <= MAX_EVENTS:
        raise DataError(f"{where}: 'events' has {len(events)} entries; expected {MIN_EVENTS} to {MAX_EVENTS}")
    if events.count(BLANK) != 1:
        raise DataError(f"{where}: 'events' must contain exactly one {BLANK!r}; found {events.count(BLANK)}")
    if not isinstance(choices, list) or len(choices) != 4 or not all(isinstance(c, str) and c.strip() for c in choices):
        raise DataError(f"{where}: 'choices' must be a list of 4 non-empty strings")
    key = "answer" if "answer" in raw else "label"
    answer = raw.get(key)
    if isinstance(answer, str) and answer.strip().upper() in tuple(LETTERS):
        answer = LETTERS.index(answer.strip().upper())
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < 4:
        raise DataError(f"{where}: '{key}' is {answer!r}; expected 0-3 or 'A'-'D'")
    return InfillingItem(tuple(events), tuple(choices), answer)


def read_jsonl(path: str | Path) -> list[InfillingItem]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"{path}: no such infilling file (JSONL, one item per line)")
    items = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{p}:{n}: not valid JSON ({e.msg})") from None
        items.append(parse_item(raw, f"{p}:{n}"))
    if not items:
        raise DataError(f"{p}: holds no items")
    return items


def write_jsonl(items: Iterable[InfillingItem], path: str | Path) -> Path:
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"events": list(i.events), "choices": list(i.choices), "answer": i.answer}) for i in items]
    p.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return p


# ---- synthetic stories: event chains in which each step follows from the one before ----

CHAINS = [  # {name} is filled in; each chain is seven events in order
    [
        "{name} wakes up early on a cold morning.",
        "{name} puts the kettle on and makes a cup of tea.",
        "{name} eats a bowl of porridge at the kitchen table.",
        "{name} washes the bowl and the cup in the sink.",
        "{name} puts on a warm coat and a scarf.",
        "{name} locks the front door and walks to the bus stop.",
        "{name} rides the bus to work and arrives on time.",
    ],
    [
        "{name} decides to bake a loaf of bread.",
        "{name} mixes flour, water, yeast and salt in a bowl.",
        "{name} kneads the dough until it is smooth.",
        "{name} leaves the dough to rise for an hour.",
        "{name} shapes the dough and puts it in a hot oven.",
        "{name} takes the golden loaf out of the oven.",
        "{name} slices the warm bread and shares it with friends.",
    ],
    [
        "{name} plans a trip to the mountains.",
        "{name} packs a tent, a map and warm clothes.",
        "{name} drives to the foot of the mountain.",
        "{name} climbs the trail for hours.",
        "{name} reaches the top and looks at the valley below.",
        "{name} pitches the tent as the sun goes down.",
        "{name} sleeps under the stars and walks down the next day.",
    ],
    [
        "{name} finds a small seed in an old envelope.",
        "{name} plants the seed in a pot of soil.",
        "{name} waters the pot every morning.",
        "{name} sees a green shoot push through the soil.",
        "{name} moves the growing plant to the garden.",
        "{name} watches the plant grow taller than the fence.",
        "{name} picks the first flower and gives it to a neighbour.",
    ],
    [
        "{name} notices that the old bicycle has a flat tyre.",
        "{name} takes the wheel off the bicycle.",
        "{name} finds the hole in the inner tube.",
        "{name} patches the hole with glue and a rubber patch.",
        "{name} pumps the tyre back up.",
        "{name} puts the wheel back on the bicycle.",
        "{name} rides the bicycle to the park.",
    ],
    [
        "{name} gets a letter inviting them to a wedding.",
        "{name} buys a present for the couple.",
        "{name} irons a shirt for the day.",
        "{name} travels by train to the town of the wedding.",
        "{name} watches the couple say their vows.",
        "{name} dances with the guests late into the night.",
        "{name} travels home tired and happy the next morning.",
    ],
]
NAMES = ["Ellie", "Omar", "Mia", "Jonas", "Priya", "Tom", "Lena", "Kofi", "Ana", "Sam"]


def synthetic_items(n: int, seed: int = 0) -> list[InfillingItem]:
    """``n`` items from the templated chains, deterministic in ``seed``: a window of 3–7 consecutive events of
    one chain with one blanked; the right choice is the blanked event, the three distractors are events of
    three other chains (with the same name), so exactly one choice continues the story."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        name = rng.choice(NAMES)
        c = rng.randrange(len(CHAINS))
        k = rng.randint(MIN_EVENTS, MAX_EVENTS)
        start = rng.randint(0, len(CHAINS[c]) - k)
        events = [e.format(name=name) for e in CHAINS[c][start : start + k]]
        blank = rng.randrange(k)
        right = events[blank]
        events[blank] = BLANK
        others = rng.sample([i for i in range(len(CHAINS)) if i != c], 3)
        choices = [rng.choice(CHAINS[o]).format(name=name) for o in others]
        answer = rng.randrange(4)
        choices.insert(answer, right)
        items.append(InfillingItem(tuple(events), tuple(choices), answer))
    return items
