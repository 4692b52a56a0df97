"""Tasks and the expert of the shop scenario (written for pretrained chat models such as SmolLM2).

A clerk reads a price list and says what one kind of fruit costs; a cashier hears the clerk's price and
says what a quantity of it costs. The observations are plain English sentences; each agent is asked for a
bare number, and the rule verifiers read the number tolerantly (the last line, a trailing period or bold
stripped), so a reply such as "6." still counts while "The total is 6 dollars" does not.
"""

from __future__ import annotations

import random
import re

FRUITS = ("apples", "pears", "plums", "lemons", "oranges", "peaches", "grapes", "figs", "mangoes", "cherries")
LIST_LENGTH = 3
PRICE = re.compile(r"How much do (\w+) cost\?")
ORDER = re.compile(r"buys (\d+) \w+ at (\d+) dollars? each")


def generate_tasks(seed: int, count: int) -> list[dict]:
    """Each task: a price list of LIST_LENGTH fruits (1-9 dollars), the fruit asked for, a quantity 1-3."""
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        fruits = rng.sample(FRUITS, LIST_LENGTH)
        prices = [rng.randint(1, 9) for _ in fruits]
        wanted, quantity = rng.randrange(LIST_LENGTH), rng.randint(1, 3)
        listing = ", ".join(f"{fruit} {price} dollars" for fruit, price in zip(fruits, prices))
        tasks.append({
            "id": f"shop-{index}",
            "prompt": f"Price list: {listing}. A customer buys {quantity} {fruits[wanted]}.",
            "answer": str(quantity * prices[wanted]),
            "metadata": {"listing": listing, "fruit": fruits[wanted], "quantity": str(quantity),
                         "price": str(prices[wanted])},
            # a product is harder than a lookup: quantity 1 is the easy bucket
            "difficulty": float(quantity > 1),
        })
    return tasks


def expert(agent: str, observation: str, task) -> str:
    """The clerk looks the price up in the list it sees; the cashier multiplies the price it hears."""
    if agent == "clerk":
        match = PRICE.search(observation)
        listing = dict(re.findall(r"(\w+) (\d+) dollars", observation))
        return listing.get(match.group(1), "") if match else ""
    match = ORDER.search(observation)
    return str(int(match.group(1)) * int(match.group(2))) if match else ""
