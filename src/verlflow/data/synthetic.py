"""Seeded GSM8K-style word problems, so smoke runs and tests need no network.

    python -c "from verlflow.data.synthetic import synthetic_examples; print(synthetic_examples(1, seed=0)[0])"

Problems of one to three arithmetic steps from a few dozen templates, with GSM8K's solution format
(``<<a*b=c>>`` calculations, a final ``#### <int>`` line). Deterministic for a seed; train and test never
overlap, because a question's hash decides the split it belongs to.
"""

from __future__ import annotations

import hashlib
import random

from verlflow.errors import VerlflowError

# (question, numbers, steps). Numbers: "x:lo-hi" draws an int, "x=y*z" derives one (so that
# divisions come out exact). Each step is (lead-in, "x op y", unit) and its result is s1, s2, s3;
# the last one is the answer. Draws that give a result <= 0 or an inexact division are redrawn.
_TEMPLATES: tuple[tuple[str, str, tuple[tuple[str, str, str], ...]], ...] = (
    ("{name} has {a} {obj}. {Pron} buys {b} more. How many {obj} does {name} have now?",
     "a:3-60 b:2-40", (("{Pron} now has", "a + b", "{obj}"),)),
    ("{name} had {a} {obj} and gave {b} of them to {friend}. How many {obj} does {name} have left?",
     "b:2-30 k:1-40 a=b+k", (("{Pron} has", "a - b", "{obj} left"),)),
    ("{name} buys {a} packs of {obj}. Each pack has {b} {obj}. How many {obj} does {pron} buy?",
     "a:2-12 b:3-15", (("{Pron} buys", "a * b", "{obj}"),)),
    ("{name} shares {a} {food} equally among {b} friends. How many {food} does each friend get?",
     "b:2-9 k:2-12 a=b*k", (("Each friend gets", "a / b", "{food}"),)),
    ("{name} buys {a} {obj} for ${b} each. How much does {pron} spend in dollars?",
     "a:2-15 b:2-20", (("{Pron} spends", "a * b", "$"),)),
    ("{name} buys {a} {obj} at ${b} each and pays with a ${c} bill. How much change does {pron} get?",
     "a:2-6 b:2-9 p=a*b k:1-20 c=p+k", (("The {obj} cost", "a * b", "$"), ("{Pron} gets back", "c - s1", "$"))),
    ("{name} reads {a} pages on Monday and {b} pages on Tuesday. On Wednesday {pron} reads {c} times as "
     "many pages as on Monday. How many pages does {pron} read in the three days?",
     "a:5-30 b:5-30 c:2-4", (("On Wednesday {pron} reads", "a * c", "pages"),
                             ("On Monday and Tuesday {pron} reads", "a + b", "pages"),
                             ("In total {pron} reads", "s2 + s1", "pages"))),
    ("A bakery makes {a} trays of {food} with {b} {food} on each tray. It sells {c} of them. How many "
     "{food} are left?", "a:3-9 b:4-12 c:5-60", (("The bakery makes", "a * b", "{food}"),
                                                 ("It has", "s1 - c", "{food} left"))),
    ("{name} earns ${a} per hour and works {b} hours a day for {c} days. How much does {pron} earn?",
     "a:8-25 b:2-8 c:2-6", (("Each day {pron} earns", "a * b", "$"), ("In {c} days {pron} earns", "s1 * c", "$"))),
    ("{name} has {a} {obj}. {friend} has {b} times as many. How many {obj} do they have together?",
     "a:2-25 b:2-5", (("{friend} has", "a * b", "{obj}"), ("Together they have", "a + s1", "{obj}"))),
    ("{name} is {a} years old. {friend} is {b} years older than {name}. How old will {friend} be in {c} "
     "years?", "a:5-40 b:2-15 c:2-20", (("{friend} is", "a + b", "years old"),
                                         ("In {c} years {friend} will be", "s1 + c", "years old"))),
    ("A box holds {a} {obj}. {name} has {b} {obj}. How many boxes can {pron} fill?",
     "a:4-12 k:2-10 b=a*k", (("{Pron} can fill", "b / a", "boxes"),)),
    ("{name} runs {a} miles a day for {b} days. {friend} runs {c} miles in total over the same days. How "
     "many more miles does {name} run than {friend}?",
     "a:2-9 b:3-7 c:5-40", (("{name} runs", "a * b", "miles"), ("{name} runs", "s1 - c", "more miles"))),
    ("{name} saves ${a} each week. How many weeks does it take {pron} to save ${b}?",
     "a:3-25 k:2-12 b=a*k", (("It takes", "b / a", "weeks"),)),
    ("There are {a} students in a class. {b} of them are in the choir and {c} are in the band. No one is "
     "in both. How many students are in neither?", "a:20-40 b:3-12 c:3-12",
     (("In the choir or the band are", "b + c", "students"), ("In neither are", "a - s1", "students"))),
    ("{name} bakes {a} {food}. {Pron} eats {b} and puts the rest equally into {c} bags. How many {food} "
     "are in each bag?", "b:1-5 c:2-6 k:2-8 p=c*k a=p+b",
     (("{Pron} has", "a - b", "{food} to pack"), ("Each bag gets", "s1 / c", "{food}"))),
    ("A train travels {a} miles per hour for {b} hours. How many miles does it travel?",
     "a:20-90 b:2-8", (("It travels", "a * b", "miles"),)),
    ("{name} buys {a} notebooks for ${b} each and {c} pens for ${d} each. How much does {pron} spend?",
     "a:2-8 b:2-9 c:2-10 d:1-5", (("The notebooks cost", "a * b", "$"), ("The pens cost", "c * d", "$"),
                                  ("In total {pron} spends", "s1 + s2", "$"))),
    ("{name} has ${a}. {Pron} spends ${b} on lunch and ${c} on a book. How much money does {pron} have "
     "left?", "a:30-100 b:5-20 c:5-30", (("{Pron} spends", "b + c", "$"), ("{Pron} has left", "a - s1", "$"))),
    ("A garden has {a} rose bushes with {b} roses each. {name} picks {c} roses from every bush. How many "
     "roses are left in the garden?", "a:3-12 b:6-15 c:1-5",
     (("Each bush keeps", "b - c", "roses"), ("The garden has", "s1 * a", "roses left"))),
    ("{name} collects {a} {obj} on Monday. On Tuesday {pron} collects {b} more than on Monday. How many "
     "{obj} does {pron} collect on the two days?", "a:3-40 b:2-20",
     (("On Tuesday {pron} collects", "a + b", "{obj}"), ("On both days {pron} collects", "a + s1", "{obj}"))),
    ("A parking lot has {a} levels with {b} spaces on each level. {c} spaces are taken. How many spaces "
     "are free?", "a:2-6 b:10-40 c:5-80", (("The lot has", "a * b", "spaces"), ("Free are", "s1 - c", "spaces"))),
    ("{name} wants a bike that costs ${a}. {Pron} has ${b} and earns ${c} a week. How many weeks must "
     "{pron} work to buy the bike?", "b:10-60 c:5-20 k:2-10 p=c*k a=p+b",
     (("{Pron} still needs", "a - b", "$"), ("{Pron} must work", "s1 / c", "weeks"))),
    ("A pizza is cut into {a} slices. {name} orders {b} pizzas and {c} people each eat {d} slices. How "
     "many slices are left?", "a:6-12 b:2-6 c:2-8 d:1-4",
     (("There are", "a * b", "slices"), ("The people eat", "c * d", "slices"), ("Left are", "s1 - s2", "slices"))),
    ("{name} plants {a} {plant} seeds in each of {b} pots. Only {c} seeds sprout. How many seeds do not "
     "sprout?", "a:3-10 b:3-10 c:4-50",
     (("{Pron} plants", "a * b", "seeds"), ("Not sprouting are", "s1 - c", "seeds"))),
    ("{name} drives {a} miles to work and {b} miles back home on a longer road each day. How many miles "
     "does {pron} drive in {c} days?", "a:3-30 b:3-30 c:2-6",
     (("Each day {pron} drives", "a + b", "miles"), ("In {c} days {pron} drives", "s1 * c", "miles"))),
    ("A store has {a} {obj}. It sells {b} in the morning and {c} in the afternoon. How many {obj} does the "
     "store have left?", "a:40-150 b:5-40 c:5-40",
     (("The store sells", "b + c", "{obj}"), ("It has", "a - s1", "{obj} left"))),
    ("{name} scores {a} points in each of {b} games and {c} points in the final game. How many points does "
     "{pron} score in total?", "a:3-30 b:2-8 c:5-40",
     (("In the first games {pron} scores", "a * b", "points"), ("In total {pron} scores", "s1 + c", "points"))),
    ("{name} has {a} {obj}. {Pron} gives {b} to each of {c} friends. How many {obj} does {pron} have left?",
     "a:20-90 b:2-8 c:2-6", (("{Pron} gives away", "b * c", "{obj}"), ("{Pron} has", "a - s1", "{obj} left"))),
    ("A library has {a} shelves with {b} books each. It gets {c} boxes of {d} new books. How many books "
     "does it have now?", "a:3-12 b:10-30 c:2-6 d:5-20",
     (("The shelves hold", "a * b", "books"), ("The boxes hold", "c * d", "books"),
      ("Now it has", "s1 + s2", "books"))),
    ("{name} pays ${a} for {b} tickets. How much does each ticket cost in dollars?",
     "b:2-9 k:3-25 a=b*k", (("Each ticket costs", "a / b", "$"),)),
    ("{name} has {a} {obj}. {friend} has {b} fewer than {name}. How many {obj} do they have together?",
     "b:2-20 k:1-30 a=b+k", (("{friend} has", "a - b", "{obj}"), ("Together they have", "a + s1", "{obj}"))),
)
_NAMES = (("Ava", "she", "her"), ("Liam", "he", "his"), ("Mia", "she", "her"), ("Noah", "he", "his"),
          ("Zoe", "she", "her"), ("Omar", "he", "his"), ("Priya", "she", "her"), ("Kenji", "he", "his"),
          ("Lucia", "she", "her"), ("Mateo", "he", "his"), ("Amara", "she", "her"), ("Ethan", "he", "his"),
          ("Sofia", "she", "her"), ("Ravi", "he", "his"), ("Hana", "she", "her"), ("Diego", "he", "his"),
          ("Grace", "she", "her"), ("Tariq", "he", "his"), ("Elena", "she", "her"), ("Felix", "he", "his"))
_OBJECTS = ("apples", "pencils", "stickers", "marbles", "stamps", "seashells", "crayons", "cards", "beads",
            "buttons", "toy cars", "erasers")
_FOODS = ("cookies", "muffins", "cupcakes", "brownies", "bagels", "tarts")
_PLANTS = ("tomato", "sunflower", "pepper", "bean", "pumpkin")
_OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
        "/": lambda x, y: x // y if y and x % y == 0 else 0}  # 0: inexact, redrawn


# The easy level: one-step templates, every drawn number 1..EASY_MAX (results up to 81).
EASY_MAX = 9


def synthetic_examples(n: int, seed: int, split: str = "train", *, easy: bool = False) -> list[dict]:
    """``n`` distinct GSM8K-style word problems (1-3 arithmetic steps, answer ``#### <int>``), seeded.

    Deterministic for (n, seed, split, easy). Train and test draw from per-split seeds and from disjoint
    parts of the problem space (a hash of the question decides its split), so they never overlap.
    ``easy`` keeps one-step problems on single-digit numbers: arithmetic a model of a few million
    parameters learns in a minute on a CPU, so that its first GRPO run has something to get right.
    """
    if split not in ("train", "test"):
        raise VerlflowError(f"unknown split '{split}': use 'train' or 'test'")
    if n < 0:
        raise VerlflowError(f"number of synthetic problems must be >= 0, got {n}")
    level = ":easy" if easy else ""
    rng = random.Random(f"verlflow-synthetic:{seed}:{split}{level}")  # str seeds are hashed stably (sha512)
    templates = tuple(t for t in _TEMPLATES if len(t[2]) == 1) if easy else _TEMPLATES
    examples: list[dict] = []
    seen: set[str] = set()
    for _ in range(100 * n + 1000):
        if len(examples) == n:
            return examples
        example = _draw_problem(rng, templates, EASY_MAX if easy else None)
        question = example["question"] if example else ""
        if not example or question in seen or _split_of(question) != split:
            continue
        seen.add(question)
        examples.append(example)
    if len(examples) == n:
        return examples
    raise VerlflowError(f"could only generate {len(examples)} distinct synthetic {split} problems, not {n}")


def _draw_problem(rng: random.Random, templates: tuple, largest: int | None) -> dict | None:
    question, numbers, steps = rng.choice(templates)
    (name, pron, pos), (friend, _, _) = rng.sample(_NAMES, 2)
    values: dict[str, int] = {}
    for spec in numbers.split():
        if ":" in spec:
            var, bounds = spec.split(":")
            low, high = bounds.split("-")
            low, high = int(low), int(high)
            if largest is not None:
                low, high = min(low, largest), min(high, largest)
            values[var] = rng.randint(low, high)
        else:
            var, expression = spec.split("=")
            values[var] = _OPS[expression[1]](values[expression[0]], values[expression[2]])
    words = {"name": name, "friend": friend, "pron": pron, "Pron": pron.capitalize(), "pos": pos,
             "obj": rng.choice(_OBJECTS), "food": rng.choice(_FOODS), "plant": rng.choice(_PLANTS)}
    lines = []
    for number, (lead, expression, unit) in enumerate(steps, start=1):
        left, op, right = expression.split()
        x, y = values[left], values[right]
        result = _OPS[op](x, y)
        if result <= 0:
            return None
        values[f"s{number}"] = result
        calc = f"<<{x}{op}{y}={result}>>{result}"
        text = f"{x} {op} {y} = ${calc}." if unit == "$" else f"{x} {op} {y} = {calc} {unit}."
        lines.append(f"{lead} {text}".format(**words, **values))
    lines.append(f"#### {values[f's{len(steps)}']}")
    return {"question": question.format(**words, **values), "answer": "\n".join(lines)}


def _split_of(question: str) -> str:
    return "test" if int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) % 5 == 0 else "train"
