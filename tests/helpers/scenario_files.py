"""Scenario file texts shared by test rooms."""

# one minimal sound scenario: the base that hostile and schema tests break one way at a time
GOOD = """\
name: tiny
agents:
  - name: a
  - name: b
graph:
  edges: [[a, b]]
  order: topological
tasks:
  inline:
    - prompt: "1+1="
      answer: "2"
rewards:
  outcome:
    - kind: exact
"""


ADDITION_PAIRS = [(12, 35), (47, 19), (23, 58), (66, 27), (31, 44), (18, 29), (52, 39), (74, 17)]


def race_yaml(pairs: int = 4, train: str = "") -> str:
    """A competitive scenario the addition model can play: both agents answer; the correct one wins.

    `pairs` addition tasks (at most 8); `train` is appended as the file's `train:` section body."""
    tasks = "".join(f"    - {{prompt: '{a}+{b}=', answer: '{a + b}'}}\n" for a, b in ADDITION_PAIRS[:pairs])
    text = ("name: race\nmode: competitive\nagents:\n"
            "  - {name: first, observation: \"{prompt}\", max_tokens: 4}\n"
            "  - {name: second, observation: \"{prompt}\", max_tokens: 4}\n"
            "graph: {order: schedule, schedule: [[first, second]]}\ntasks:\n  inline:\n" + tasks +
            "rewards:\n  outcome: [{kind: exact}]\n")
    return text + (f"train:\n{train}" if train else "")
