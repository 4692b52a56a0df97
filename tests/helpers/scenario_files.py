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
