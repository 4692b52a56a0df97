"""Tools, tasks, expert and scorers of the weather scenario.

The world is a fixed snapshot (`SNAPSHOT`): per city, the temperature (deg C), the conditions and the
air-quality index. Running is advisable iff 10 <= temperature <= 25 and AQI < 100. The agent must find
out with the tools `get_weather(city)` and `get_air_quality(city)`, then answer `ANSWER: yes` or
`ANSWER: no`.
"""

from __future__ import annotations

import random
import re

# city: (temperature_c, conditions, aqi). Boundary cases on purpose: 10 and 25 deg C are fine, 9 and 26
# are not; AQI 99 is fine, 100 is not.
SNAPSHOT: dict[str, tuple[int, str, int]] = {
    "Paris": (18, "partly cloudy", 42),
    "London": (14, "light rain", 35),
    "Berlin": (9, "overcast", 28),
    "Madrid": (31, "sunny", 57),
    "Rome": (24, "sunny", 88),
    "Vienna": (10, "clear", 61),
    "Oslo": (4, "snow showers", 18),
    "Stockholm": (12, "windy", 22),
    "Lisbon": (22, "sunny", 31),
    "Athens": (29, "hot and dry", 104),
    "Warsaw": (16, "cloudy", 112),
    "Prague": (25, "clear", 99),
    "Dublin": (11, "drizzle", 15),
    "Amsterdam": (15, "breezy", 47),
    "Brussels": (17, "cloudy", 100),
    "Zurich": (8, "fog", 20),
    "Istanbul": (21, "humid", 143),
    "Cairo": (34, "sunny", 168),
    "Delhi": (27, "hazy", 212),
    "Beijing": (19, "smog", 187),
    "Tokyo": (20, "clear", 53),
    "Seoul": (13, "clear", 96),
    "Sydney": (23, "sunny", 24),
    "Toronto": (26, "humid", 40),
    "Chicago": (7, "windy", 38),
    "Denver": (15, "sunny", 71),
    "Mexico City": (22, "hazy", 128),
    "Lima": (19, "overcast", 64),
    "Nairobi": (21, "mild", 58),
    "Cape Town": (16, "breezy", 19),
    "Mumbai": (32, "humid", 158),
    "Singapore": (30, "thunderstorms", 45),
    "Helsinki": (10, "cold and clear", 12),
    "Reykjavik": (6, "windy", 9),
    "Vancouver": (14, "rain", 26),
    "Santiago": (25, "sunny", 105),
}

TEMPLATES = (
    "Should I go running in {city} today?",
    "Is it a good day for a run in {city}?",
    "I am in {city}. Is running outside advisable today?",
    "Thinking of a jog in {city} today: yes or no?",
)


def _lookup(city: str) -> tuple[str, tuple[int, str, int]]:
    key = " ".join(str(city).split()).casefold()
    for name, values in SNAPSHOT.items():
        if name.casefold() == key:
            return name, values
    raise ValueError(f"unknown city {city!r}")


def get_weather(city: str) -> dict:
    """Current weather of a city in the snapshot."""
    name, (temperature, conditions, _) = _lookup(city)
    return {"city": name, "temperature_c": temperature, "conditions": conditions}


def get_air_quality(city: str) -> dict:
    """Current air-quality index (AQI) of a city in the snapshot."""
    name, (_, _, aqi) = _lookup(city)
    return {"city": name, "aqi": aqi}


def advisable(temperature: float, aqi: float) -> bool:
    """The rule of the scenario."""
    return 10 <= temperature <= 25 and aqi < 100


def generate_tasks(seed: int, count: int) -> list[dict]:
    """Every (city, question template) pair, shuffled with `seed`, repeated if `count` asks for more."""
    pairs = [(city, template) for template in TEMPLATES for city in SNAPSHOT]
    random.Random(seed).shuffle(pairs)
    tasks = []
    for index in range(count):
        city, template = pairs[index % len(pairs)]
        temperature, _, aqi = SNAPSHOT[city]
        tasks.append({
            "id": f"weather-{index}",
            "prompt": template.format(city=city),
            "answer": "yes" if advisable(temperature, aqi) else "no",
            "metadata": {"city": city},
            "variants": [t.format(city=city) for t in TEMPLATES if t != template][:2],
        })
    return tasks


# -- the expert -------------------------------------------------------------------------------------

_RESULT = re.compile(r"^\[(get_weather|get_air_quality)\] (\{.*\})\s*$", re.MULTILINE)


def expert(agent: str, observation: str, task) -> str:
    """Turn 1: call both tools. Turn 2: apply the rule to the results shown in the observation."""
    import json

    seen = {}
    for name, payload in _RESULT.findall(observation):
        try:
            seen[name] = json.loads(payload)
        except ValueError:
            continue
    if "get_weather" not in seen or "get_air_quality" not in seen:
        city = task.metadata["city"]
        return f'get_weather(city="{city}")\nget_air_quality(city="{city}")'
    temperature, aqi = seen["get_weather"]["temperature_c"], seen["get_air_quality"]["aqi"]
    verdict = "yes" if advisable(temperature, aqi) else "no"
    return f"{temperature} C and AQI {aqi}. ANSWER: {verdict}"


# -- scorers ----------------------------------------------------------------------------------------

_VERDICT = re.compile(r"answer:\s*\**\s*(yes|no)\b", re.IGNORECASE)


def verdict(text: str) -> str | None:
    """'yes' or 'no' from the last `ANSWER: yes|no` in text; None when the text gives no answer."""
    found = _VERDICT.findall(text or "")
    return found[-1].lower() if found else None


def _calls_before_final_message(candidate) -> list:
    """The candidate agent's tool calls made in messages before its final one (calls carry their turn)."""
    own_turns = [turn["turn"] for turn in candidate.transcript if turn["agent"] == candidate.agent]
    final_turn = own_turns[-1] if own_turns else -1
    return [call for call in candidate.tool_calls
            if call.agent == candidate.agent and call.turn is not None and call.turn < final_turn]


def correct_after_weather(item, candidate) -> float:
    """1 for the right verdict, but only when a successful get_weather call for the asked city came in
    an earlier message than the answer (an answer written before seeing the weather does not count).
    The answer and the calls' arguments (the agent's text) are read inside `candidate_input`."""
    from judges.types import candidate_input

    city = str(item.metadata.get("city", "")).casefold()
    with candidate_input("the answer and the tool calls"):
        said = verdict(candidate.text)
        if said is None or said != str(item.answer).lower():
            return 0.0
        looked = any(call.ok and call.name == "get_weather"
                     and " ".join(str(call.arguments.get("city", "")).split()).casefold() == city
                     for call in _calls_before_final_message(candidate))
    return 1.0 if looked else 0.0


def both_tools_called(item, candidate) -> float:
    """1 when both get_weather and get_air_quality were called successfully by the agent, else 0."""
    from judges.types import candidate_input

    with candidate_input("the tool calls"):
        names = {str(call.name) for call in candidate.tool_calls if call.ok and call.agent == candidate.agent}
    return 1.0 if {"get_weather", "get_air_quality"} <= names else 0.0


def not_answered_blind(item, candidate) -> float:
    """Penalty scorer: 0 (the penalty applies) when the agent gave an answer without making any successful
    tool call; 1 otherwise. Saying nothing is not an answer, so the silent agent is not penalised.
    The answer is read inside `candidate_input`: text no parser survives earns the penalty (a 0)."""
    from judges.types import candidate_input

    with candidate_input("the answer"):
        answered = verdict(candidate.text) is not None
    if not answered:
        return 1.0
    return 1.0 if any(call.ok and call.agent == candidate.agent for call in candidate.tool_calls) else 0.0
