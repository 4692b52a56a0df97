"""Preference pairs for a small pairwise judge: short questions, one correct and one subtly wrong answer.

    python examples/judge_pairs/make_pairs.py              # writes train.jsonl and heldout.jsonl next to this file
    python examples/judge_pairs/make_pairs.py --seed 1 --out-dir /tmp/pairs

Four kinds of question, 400 pairs in all (seed 0):
- arithmetic (110): sums, differences, products, exact quotients, percentages and word problems; the
  answer is computed here, the wrong one is a near miss (off by 1, 2, 10 or 100, or two digits swapped);
- units (104): exact conversions (km/m, kg/g, h/min, ft/in, in/cm, L/mL, degrees C/F, ...); the wrong
  answer uses a confused factor (100 for 1000, 100 for 60, 2.5 for 2.54, ...) or is off by ten;
- facts (86 of the 87): a hand-written table (FACTS) of questions, their answer and a plausible wrong one
  (capitals, chemical symbols, authors, dates, anatomy, computing);
- code output (100): one- or two-line Python snippets whose printed output is computed by running
  them here; the wrong answer is a typical slip (off by one, float vs int, banker's rounding, ...).

Every answer is rendered in one of four styles, drawn independently for the correct and the wrong
answer by a balanced design, so that neither length nor format says which one is right:
length (short: the bare answer or one sentence; long: the same sentence between a neutral opener and
closer) x format (plain text, or markdown: bold, a heading, a bullet or a code block). Per split the 16
(correct style, wrong style) cells each take 1/16 of the pairs (up to rounding), so the correct
answer is the longer one in about half of the pairs where the lengths differ, and the formatted one
in about half of those where only one is formatted.

The pairs are split per kind, seeded, half and half: train.jsonl (200 lines of {"id", "kind",
"prompt", "chosen", "rejected", "answers"}: `marl rm train --pairs`) and heldout.jsonl (200 lines of
{"id", "kind", "prompt", "candidates", "gold", "length", "format", "answers"}: `marl judges report
--items`), with the correct answer first in exactly half of the held-out items. `answers` holds the
bare answer inside each rendered one (chosen then rejected; per candidate), for checking; the
commands read only their own keys. No question is in both halves, nor twice in one, in any wording
(`question_key`: a code question is its snippet, another its statement). `length` says which candidate has the long style ("correct", "wrong", or "same style": both
short or both long), `format` which one is markdown ("correct", "wrong", "both", "neither").
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
COUNTS = {"arithmetic": 110, "units": 104, "facts": 86, "code": 100}

# (question, statement with {} for the answer, correct answer, plausible wrong answer). Kept to facts
# that do not change over time and have one accepted answer.
FACTS = [
    ("What is the capital of Australia?", "The capital of Australia is {}", "Canberra", "Sydney"),
    ("What is the capital of Canada?", "The capital of Canada is {}", "Ottawa", "Toronto"),
    ("What is the capital of Brazil?", "The capital of Brazil is {}", "Brasília", "Rio de Janeiro"),
    ("What is the capital of Turkey?", "The capital of Turkey is {}", "Ankara", "Istanbul"),
    ("What is the capital of Switzerland?", "The capital of Switzerland is {}", "Bern", "Zurich"),
    ("What is the capital of New Zealand?", "The capital of New Zealand is {}", "Wellington", "Auckland"),
    ("What is the capital of Morocco?", "The capital of Morocco is {}", "Rabat", "Casablanca"),
    ("What is the capital of Nigeria?", "The capital of Nigeria is {}", "Abuja", "Lagos"),
    ("What is the capital of Vietnam?", "The capital of Vietnam is {}", "Hanoi", "Ho Chi Minh City"),
    ("What is the capital of South Korea?", "The capital of South Korea is {}", "Seoul", "Busan"),
    ("What is the capital of Kenya?", "The capital of Kenya is {}", "Nairobi", "Mombasa"),
    ("What is the capital of Pakistan?", "The capital of Pakistan is {}", "Islamabad", "Karachi"),
    ("What is the capital of Scotland?", "The capital of Scotland is {}", "Edinburgh", "Glasgow"),
    ("What is the capital of Egypt?", "The capital of Egypt is {}", "Cairo", "Alexandria"),
    ("What is the capital of Spain?", "The capital of Spain is {}", "Madrid", "Barcelona"),
    ("What is the capital of India?", "The capital of India is {}", "New Delhi", "Mumbai"),
    ("What is the capital of the United States?", "The capital of the United States is {}", "Washington, D.C.",
     "New York City"),
    ("What is the capital of Italy?", "The capital of Italy is {}", "Rome", "Milan"),
    ("What is the capital of Germany?", "The capital of Germany is {}", "Berlin", "Munich"),
    ("What is the chemical symbol for gold?", "The chemical symbol for gold is {}", "Au", "Ag"),
    ("What is the chemical symbol for silver?", "The chemical symbol for silver is {}", "Ag", "Si"),
    ("What is the chemical symbol for sodium?", "The chemical symbol for sodium is {}", "Na", "So"),
    ("What is the chemical symbol for potassium?", "The chemical symbol for potassium is {}", "K", "P"),
    ("What is the chemical symbol for iron?", "The chemical symbol for iron is {}", "Fe", "Ir"),
    ("What is the chemical symbol for lead?", "The chemical symbol for lead is {}", "Pb", "Pd"),
    ("What is the chemical symbol for tungsten?", "The chemical symbol for tungsten is {}", "W", "Ti"),
    ("What is the chemical symbol for mercury?", "The chemical symbol for mercury is {}", "Hg", "Mg"),
    ("What is the atomic number of carbon?", "The atomic number of carbon is {}", "6", "12"),
    ("What is the atomic number of oxygen?", "The atomic number of oxygen is {}", "8", "16"),
    ("Which element has atomic number 1?", "The element with atomic number 1 is {}", "hydrogen", "helium"),
    ("Which planet is closest to the Sun?", "The planet closest to the Sun is {}", "Mercury", "Venus"),
    ("Which is the largest planet in the Solar System?", "The largest planet in the Solar System is {}",
     "Jupiter", "Saturn"),
    ("How many planets are in the Solar System?", "The number of planets in the Solar System is {}", "8", "9"),
    ("Which planet is known as the Red Planet?", "The planet known as the Red Planet is {}", "Mars", "Venus"),
    ("On which planet is the Great Red Spot?", "The Great Red Spot is on {}", "Jupiter", "Neptune"),
    ('Who wrote "Pride and Prejudice"?', '"Pride and Prejudice" was written by {}', "Jane Austen",
     "Charlotte Brontë"),
    ('Who wrote "Hamlet"?', '"Hamlet" was written by {}', "William Shakespeare", "Christopher Marlowe"),
    ('Who wrote "1984"?', '"1984" was written by {}', "George Orwell", "Aldous Huxley"),
    ('Who wrote "War and Peace"?', '"War and Peace" was written by {}', "Leo Tolstoy", "Fyodor Dostoevsky"),
    ('Who wrote "One Hundred Years of Solitude"?', '"One Hundred Years of Solitude" was written by {}',
     "Gabriel García Márquez", "Jorge Luis Borges"),
    ('Who wrote "On the Origin of Species"?', '"On the Origin of Species" was written by {}', "Charles Darwin",
     "Gregor Mendel"),
    ("Who painted the Mona Lisa?", "The Mona Lisa was painted by {}", "Leonardo da Vinci", "Michelangelo"),
    ('Who painted "The Starry Night"?', '"The Starry Night" was painted by {}', "Vincent van Gogh", "Claude Monet"),
    ('Who composed the opera "The Magic Flute"?', '"The Magic Flute" was composed by {}',
     "Wolfgang Amadeus Mozart", "Ludwig van Beethoven"),
    ("Who developed the general theory of relativity?", "The general theory of relativity was developed by {}",
     "Albert Einstein", "Isaac Newton"),
    ("Who was the first person to walk on the Moon?", "The first person to walk on the Moon was {}",
     "Neil Armstrong", "Buzz Aldrin"),
    ("Who discovered penicillin?", "Penicillin was discovered by {}", "Alexander Fleming", "Louis Pasteur"),
    ("Who formulated the three laws of motion of classical mechanics?",
     "The three laws of motion were formulated by {}", "Isaac Newton", "Galileo Galilei"),
    ("Who created the Python programming language?", "Python was created by {}", "Guido van Rossum",
     "Larry Wall"),
    ("Who created the Linux kernel?", "The Linux kernel was created by {}", "Linus Torvalds", "Richard Stallman"),
    ("In which year did World War II end?", "World War II ended in {}", "1945", "1944"),
    ("In which year did the Berlin Wall fall?", "The Berlin Wall fell in {}", "1989", "1991"),
    ("In which year did humans first land on the Moon?", "Humans first landed on the Moon in {}", "1969", "1968"),
    ("In which year did the Titanic sink?", "The Titanic sank in {}", "1912", "1915"),
    ("In which year did Christopher Columbus first reach the Americas?",
     "Christopher Columbus first reached the Americas in {}", "1492", "1498"),
    ("What is the boiling point of water at sea level, in degrees Celsius?",
     "At sea level, water boils at {}", "100 °C", "90 °C"),
    ("At what temperature in degrees Fahrenheit does water freeze?", "Water freezes at {}", "32 °F", "0 °F"),
    ("What is the chemical formula of water?", "The chemical formula of water is {}", "H2O", "H2O2"),
    ("What is the chemical formula of table salt?", "The chemical formula of table salt is {}", "NaCl", "KCl"),
    ("Which gas makes up most of Earth's atmosphere?", "Most of Earth's atmosphere is {}", "nitrogen", "oxygen"),
    ("Which gas do plants take in for photosynthesis?", "For photosynthesis, plants take in {}", "carbon dioxide",
     "oxygen"),
    ("What is the hardest natural mineral?", "The hardest natural mineral is {}", "diamond", "quartz"),
    ("What is the largest ocean on Earth?", "The largest ocean on Earth is the {}", "Pacific Ocean",
     "Atlantic Ocean"),
    ("What is the highest mountain above sea level?", "The highest mountain above sea level is {}",
     "Mount Everest", "K2"),
    ("What is the largest hot desert in the world?", "The largest hot desert in the world is the {}", "Sahara",
     "Arabian Desert"),
    ("What is the largest country in the world by area?", "The largest country by area is {}", "Russia", "Canada"),
    ("In which country are the Pyramids of Giza?", "The Pyramids of Giza are in {}", "Egypt", "Sudan"),
    ("What is the official language of Brazil?", "The official language of Brazil is {}", "Portuguese", "Spanish"),
    ("What is the currency of Japan?", "The currency of Japan is the {}", "yen", "won"),
    ("What is the currency of Switzerland?", "The currency of Switzerland is the {}", "Swiss franc", "euro"),
    ("What is the currency of the United Kingdom?", "The currency of the United Kingdom is the {}",
     "pound sterling", "euro"),
    ("How many bones are in the adult human body?", "The adult human body has {} bones", "206", "212"),
    ("How many chambers does the human heart have?", "The human heart has {} chambers", "four", "three"),
    ("Which organ produces insulin?", "Insulin is produced by the {}", "pancreas", "liver"),
    ("What is the largest organ of the human body?", "The largest organ of the human body is the {}", "skin",
     "liver"),
    ("Which blood type is the universal red-cell donor?", "The universal red-cell donor type is {}",
     "O negative", "AB positive"),
    ("What is the largest mammal?", "The largest mammal is the {}", "blue whale", "African elephant"),
    ("What is the tallest living land animal?", "The tallest living land animal is the {}", "giraffe", "elephant"),
    ("How many legs does a spider have?", "A spider has {} legs", "eight", "six"),
    ("How fast does light travel in a vacuum, roughly?", "In a vacuum, light travels at about {}",
     "300,000 km per second", "300,000 km per hour"),
    ("How many sides does a hexagon have?", "A hexagon has {} sides", "six", "eight"),
    ("What is the smallest prime number?", "The smallest prime number is {}", "2", "1"),
    ("What do the interior angles of a triangle add up to?", "The interior angles of a triangle add up to {}",
     "180 degrees", "360 degrees"),
    ("What does CPU stand for?", "CPU stands for {}", "Central Processing Unit", "Central Program Unit"),
    ("What does HTTP stand for?", "HTTP stands for {}", "Hypertext Transfer Protocol",
     "Hypertext Transmission Protocol"),
    ("How many bits are in a byte?", "A byte has {} bits", "8", "4"),
    ("How many strings does a standard violin have?", "A standard violin has {} strings", "four", "six"),
]

# the same phrases for correct and wrong answers, so they say nothing about which is right
OPENERS = ("Good question!", "Sure, here is the answer.", "Let me think about this carefully.",
           "Happy to help with this.", "Here is what I found after checking.", "Okay, let's work it out.")
CLOSERS = ("I hope this helps!", "Let me know if you have any other questions.",
           "Feel free to ask if you want more detail.", "I double-checked this before answering.",
           "That is the final answer.", "This should be everything you need.")
LENGTHS = ("short", "long")
FORMATS = ("plain", "markdown")


def number(x: float) -> str:
    """A number as people write it: an integer without a decimal point, else at most four decimals."""
    if float(x).is_integer():
        return str(int(x))
    return f"{x:.4f}".rstrip("0").rstrip(".")


def swap_digits(n: int, rng: random.Random) -> int | None:
    """n with two adjacent digits swapped (a transposition typo), or None when every swap changes nothing."""
    digits = str(abs(n))
    spots = [i for i in range(len(digits) - 1) if digits[i] != digits[i + 1] and not (i == 0 and digits[1] == "0")]
    if not spots:
        return None
    i = rng.choice(spots)
    swapped = digits[:i] + digits[i + 1] + digits[i] + digits[i + 2:]
    return int(swapped) * (-1 if n < 0 else 1)


def near_miss(n: int, rng: random.Random) -> int:
    """A plausible wrong result: off by 1, 2, 10 or 100, or two digits swapped; never n itself."""
    while True:
        choice = rng.choice(("1", "2", "10", "100", "swap"))
        wrong = swap_digits(n, rng) if choice == "swap" else n + rng.choice((-1, 1)) * int(choice)
        if wrong is not None and wrong != n and (n < 0 or wrong >= 0):
            return wrong


# -- the four kinds: each returns (prompt, statement with {}, correct value, wrong value) ---------------------
def arithmetic(rng: random.Random) -> tuple[str, str, str, str]:
    op = rng.choice(("add", "sub", "mul", "div", "percent", "word"))
    if op == "add":
        a, b = rng.randint(12, 989), rng.randint(12, 989)
        prompt, statement, value = rng.choice((f"What is {a} + {b}?", f"Add {a} and {b}.")), f"{a} + {b} = {{}}", a + b
    elif op == "sub":
        a = rng.randint(100, 999)
        b = rng.randint(11, a - 1)
        prompt, statement, value = rng.choice((f"What is {a} - {b}?", f"Subtract {b} from {a}.")), f"{a} - {b} = {{}}", a - b
    elif op == "mul":
        a, b = rng.randint(12, 99), rng.randint(3, 49)
        prompt = rng.choice((f"What is {a} × {b}?", f"Multiply {a} by {b}.", f"What is {a} times {b}?"))
        statement, value = f"{a} × {b} = {{}}", a * b
    elif op == "div":
        b, q = rng.randint(3, 25), rng.randint(4, 60)
        a = b * q
        prompt, statement, value = rng.choice((f"What is {a} ÷ {b}?", f"Divide {a} by {b}.")), f"{a} ÷ {b} = {{}}", q
    elif op == "percent":
        p = rng.choice((5, 10, 15, 20, 25, 30, 40, 50, 75))
        whole = rng.randint(2, 60) * 20
        value = p * whole // 100
        prompt, statement = f"What is {p}% of {whole}?", f"{p}% of {whole} is {{}}"
    else:
        per, count = rng.randint(6, 24), rng.randint(3, 19)
        thing, box = rng.choice((("eggs", "box"), ("pencils", "pack"), ("apples", "crate"), ("chairs", "row"),
                                 ("books", "shelf"), ("cookies", "tray")))
        prompt = f"If each {box} holds {per} {thing}, how many {thing} are in {count} of them?"
        statement, value = f"{count} × {per} = {{}} {thing}", per * count
    return prompt, statement, str(value), str(near_miss(value, rng))


# (from, to, factor, confused factor, plural names): exact conversion factors only
UNITS = [("kilometres", "metres", 1000, 100), ("metres", "centimetres", 100, 1000), ("kilograms", "grams", 1000, 100),
         ("hours", "minutes", 60, 100), ("minutes", "seconds", 60, 100), ("days", "hours", 24, 12),
         ("feet", "inches", 12, 10), ("yards", "feet", 3, 12), ("litres", "millilitres", 1000, 100),
         ("inches", "centimetres", 2.54, 2.5), ("weeks", "days", 7, 5), ("centimetres", "millimetres", 10, 100),
         ("tonnes", "kilograms", 1000, 100), ("miles", "yards", 1760, 1000)]


def units(rng: random.Random) -> tuple[str, str, str, str]:
    if rng.random() < 0.15:  # temperature: multiples of 5 degrees C give whole degrees F
        celsius = rng.choice(range(-20, 101, 5))
        value = celsius * 9 / 5 + 32
        wrong = rng.choice((celsius * 9 / 5, (celsius + 32) * 9 / 5, celsius * 2 + 32))
        if wrong == value:
            wrong = value + 10
        return (f"Convert {celsius} °C to degrees Fahrenheit.", f"{celsius} °C is {{}} °F", number(value),
                number(wrong))
    source, target, factor, confused = rng.choice(UNITS)
    amount = rng.choice((rng.randint(2, 95), rng.randint(2, 40) + 0.5)) if factor != 2.54 else rng.randint(2, 40)
    value = round(amount * factor, 6)
    wrong = round(amount * confused, 6) if rng.random() < 0.7 else round(value * rng.choice((10, 0.1)), 6)
    if wrong == value:
        wrong = value + factor
    prompt = rng.choice((f"How many {target} are in {number(amount)} {source}?",
                         f"Convert {number(amount)} {source} to {target}."))
    return prompt, f"{number(amount)} {source} is {{}} {target}", number(value), number(wrong)


def run_snippet(code: str) -> str:
    """What `code` prints (its last line), by running it: the gold answer is Python's, not ours."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # noqa: S102 - the snippets are the fixed templates below
    return out.getvalue().rstrip("\n")


WORDS = ("python", "banana", "judge", "signal", "marble", "kettle", "orange", "rocket", "planet", "window")


def code(rng: random.Random) -> tuple[str, str, str, str]:
    """(prompt, statement, what it prints, a typical wrong reading); the callers drop a row whose two agree."""
    kind = rng.choice(("len", "index", "slice", "sum_range", "floordiv", "truediv", "power", "last", "sorted",
                       "upper", "range", "join", "round", "concat", "star_range", "count"))
    word = rng.choice(WORDS)
    if kind == "len":
        snippet, wrong = f'print(len("{word}"))', str(len(word) + 1)
    elif kind == "index":
        i = rng.randint(1, len(word) - 2)
        snippet, wrong = f'print("{word}"[{i}])', word[i - 1]
    elif kind == "slice":
        i = rng.randint(0, 2)
        j = rng.randint(i + 2, len(word) - 1)
        snippet, wrong = f'print("{word}"[{i}:{j}])', word[i:j + 1]
    elif kind == "sum_range":
        n = rng.randint(4, 15)
        snippet, wrong = f"print(sum(range({n})))", str(sum(range(n + 1)))
    elif kind == "floordiv":
        b = rng.randint(2, 9)
        a = b * rng.randint(2, 12) + rng.randint(1, b - 1)
        snippet, wrong = f"print({a} // {b})", str(a // b + 1)
    elif kind == "truediv":
        b = rng.randint(2, 9)
        a = b * rng.randint(2, 12)
        snippet, wrong = f"print({a} / {b})", str(a // b)
    elif kind == "power":
        base, exp = rng.randint(2, 5), rng.randint(3, 5)
        snippet, wrong = f"print({base} ** {exp})", str(base * exp)
    elif kind == "last":
        xs = rng.sample(range(1, 50), rng.randint(4, 6))
        snippet, wrong = f"xs = {xs}\nprint(xs[-1])", str(xs[-2])
    elif kind == "sorted":
        xs = rng.sample(range(1, 30), 4)
        snippet, wrong = f"print(sorted({xs}))", str(sorted(xs, reverse=True))
    elif kind == "upper":
        snippet, wrong = f'print("{word}".upper())', word.capitalize()
    elif kind == "range":
        a = rng.randint(0, 5)
        b = a + rng.randint(3, 5)
        snippet, wrong = f"print(list(range({a}, {b})))", str(list(range(a, b + 1)))
    elif kind == "join":
        parts = rng.sample(("x", "y", "z", "a", "b", "c"), 3)
        snippet, wrong = f'print("-".join({parts}))', "-".join(parts) + "-"
    elif kind == "round":
        k = rng.randint(0, 8) * 2  # round half to even: round(k + 0.5) == k for even k
        snippet, wrong = f"print(round({k}.5))", str(k + 1)
    elif kind == "concat":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        snippet, wrong = f'print("{a}" + "{b}")', str(a + b)
    elif kind == "star_range":
        n = rng.randint(3, 6)
        snippet, wrong = f"print(*range({n}))", " ".join(str(i) for i in range(1, n + 1))
    else:
        letter = rng.choice(sorted(set(word)))
        snippet, wrong = f'print("{word}".count("{letter}"))', str(word.count(letter) + 1)
    output = run_snippet(snippet)  # a slip that happens to print the same ("kettle"[3] read as [2]) is
    # dropped by the callers, which keep only rows whose two answers differ
    prompt = rng.choice(("What does this Python code print?", "What is the output of this Python snippet?",
                         "What will this print in Python 3?"))
    return f"{prompt}\n\n```python\n{snippet}\n```", "It prints {}", output, wrong


# -- styles ----------------------------------------------------------------------------------------------------
def render(kind: str, statement: str, value: str, length: str, fmt: str, rng: random.Random) -> str:
    """One answer in a style: short or long, plain or markdown (the same phrase pools for every answer)."""
    sentence = statement.format(value)
    shown = f"`{value}`" if kind == "code" and fmt == "markdown" else value
    if length == "short":
        if fmt == "plain":
            return rng.choice((f"{value}", f"{sentence}."))
        return rng.choice((f"**{shown}**", f"**Answer:** {shown}", f"{statement.format(f'**{shown}**')}."))
    opener, closer = rng.choice(OPENERS), rng.choice(CLOSERS)
    if fmt == "plain":
        return f"{opener} {sentence}. {closer}"
    if kind == "code" and rng.random() < 0.5:
        return f"{opener}\n\n```\n{value}\n```\n\n{closer}"
    return rng.choice((f"{opener}\n\n**{sentence}.**\n\n{closer}", f"## Answer\n\n{sentence}.\n\n*{closer}*",
                       f"{opener}\n\n- **Answer:** {shown}\n- {closer}"))


def balanced_styles(count: int, rng: random.Random) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """`count` ((correct length, format), (wrong length, format)) pairs: the 16 cells in equal shares, shuffled."""
    cells = [((lc, fc), (lw, fw)) for lc in LENGTHS for lw in LENGTHS for fc in FORMATS for fw in FORMATS]
    rows = [cells[i % len(cells)] for i in range(count)]
    rng.shuffle(rows)
    return rows


def question_key(kind: str, prompt: str, statement: str) -> str:
    """What a question asks, whatever its wording: the snippet of a code question, else the statement
    ("47 + 38 = {}", "5 kilometres is {} metres"); two prompts with one key are the same question."""
    return prompt.split("\n\n", 1)[1] if kind == "code" else statement


def questions(seed: int) -> dict[str, list[tuple[str, str, str, str]]]:
    """Distinct questions (prompt, statement, correct, wrong) per kind, COUNTS of each: no two ask the same
    thing in other words (question_key)."""
    rng = random.Random(seed)
    made: dict[str, list] = {}
    seen: set[str] = set()
    for kind, count in COUNTS.items():
        if kind == "facts":
            rows = [FACTS[i] for i in rng.sample(range(len(FACTS)), count)]
        else:
            make = {"arithmetic": arithmetic, "units": units, "code": code}[kind]
            rows = []
            while len(rows) < count:
                row = make(rng)
                key = question_key(kind, row[0], row[1])
                if key not in seen and row[2] != row[3]:
                    seen.add(key)
                    rows.append(row)
        made[kind] = rows
    return made


def make_pairs(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out items): each kind split half and half (seeded), styles balanced per split."""
    rng = random.Random(seed)
    split: dict[str, list] = {"train": [], "heldout": []}
    for kind, rows in questions(seed).items():
        order = list(rows)
        rng.shuffle(order)
        half = len(order) // 2
        split["train"] += [(kind, row) for row in order[:half]]
        split["heldout"] += [(kind, row) for row in order[half:]]
    train, heldout = [], []
    for name, rows in split.items():
        rng.shuffle(rows)
        styles = balanced_styles(len(rows), rng)
        golds = [i % 2 for i in range(len(rows))]
        rng.shuffle(golds)
        for number_, ((kind, (prompt, statement, right, wrong)), (style_c, style_w), gold) in enumerate(
                zip(rows, styles, golds)):
            correct = render(kind, statement, right, *style_c, rng)
            incorrect = render(kind, statement, wrong, *style_w, rng)
            assert correct != incorrect
            item_id = f"{name}-{number_:03d}"
            if name == "train":
                train.append({"id": item_id, "kind": kind, "prompt": prompt, "chosen": correct, "rejected": incorrect,
                              "answers": [right, wrong]})
                continue
            candidates = [correct, incorrect] if gold == 0 else [incorrect, correct]
            longer = "same style" if style_c[0] == style_w[0] else "correct" if style_c[0] == "long" else "wrong"
            formatted = {("markdown", "markdown"): "both", ("plain", "plain"): "neither",
                         ("markdown", "plain"): "correct", ("plain", "markdown"): "wrong"}[style_c[1], style_w[1]]
            heldout.append({"id": item_id, "kind": kind, "prompt": prompt, "candidates": candidates, "gold": gold,
                            "length": longer, "format": formatted,
                            "answers": [right, wrong] if gold == 0 else [wrong, right]})
    return train, heldout


def extra_train_pairs(count: int, seed: int = 0) -> list[dict]:
    """`count` more training pairs (arithmetic, units and code in turn; the fact table is used up by
    make_pairs), none asking a question of make_pairs(seed) (question_key), styles balanced as there: for asking whether
    more data than the 200 training pairs gives a judge signal on the same held-out items."""
    seen = {question_key(kind, *row[:2]) for kind, rows in questions(seed).items() for row in rows}
    rng = random.Random(f"extra-{seed}")
    makers = (arithmetic, units, code)
    rows, kinds = [], ("arithmetic", "units", "code")
    while len(rows) < count:
        kind = kinds[len(rows) % 3]
        prompt, statement, right, wrong = makers[len(rows) % 3](rng)
        key = question_key(kind, prompt, statement)
        if key not in seen and right != wrong:
            seen.add(key)
            rows.append((kind, prompt, statement, right, wrong))
    out = []
    for number_, ((kind, prompt, statement, right, wrong), (style_c, style_w)) in enumerate(
            zip(rows, balanced_styles(count, rng))):
        out.append({"id": f"extra-{number_:04d}", "kind": kind, "prompt": prompt,
                    "chosen": render(kind, statement, right, *style_c, rng),
                    "rejected": render(kind, statement, wrong, *style_w, rng), "answers": [right, wrong]})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=str(HERE), help="where train.jsonl and heldout.jsonl go (default: here)")
    args = parser.parse_args(argv)
    train, heldout = make_pairs(args.seed)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "heldout.jsonl", heldout)
    print(f"wrote {out / 'train.jsonl'} ({len(train)} pairs) and {out / 'heldout.jsonl'} ({len(heldout)} items), "
          f"seed {args.seed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
