"""Episode rewards from a scenario's reward spec: layered scorers, penalties, team and zero-sum modes.

Per candidate, each layer (outcome, process, format) is the weighted mean of its scorers' scores;
the total is sum(layer weight x layer score), divided by the weights of the layers that have scorers
when `normalize` is on (the default, so the best total is 1), minus the penalties that apply. A scorer that could not
decide (a failed Judgment) leaves its layer undecided (it is never dropped, so the other scorers never decide
alone); an undecided layer with weight > 0, or a penalty scorer that could not decide, makes the total NaN,
which downstream is masked, never read as 0. A correct answer (outcome 1) that
shows none of the process markers still earns `process_credit_when_correct` (1/3) of the process
layer: the process layer rewards showing work, not the lack of it.

Modes: cooperative, every agent gets the team answer's total; competitive, each agent's own total
minus the mean over agents (zero-sum); mixed, each team's mean total minus the mean over teams.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from judges.types import Candidate, Item, Judgment, Scorer, ToolCallRecord
from marl.blend import blend_group, judgment_variance
from marl.scenario.spec import ScenarioSpec, ScorerSpec
from marl.types import Task

LAYERS = ("outcome", "process", "format")


@dataclass
class RewardBreakdown:
    """How one candidate's reward was made: per-layer scores, each scorer's verdict, penalties."""

    total: float
    layers: dict[str, float | None]
    components: list[dict[str, Any]] = field(default_factory=list)
    penalties: list[dict[str, Any]] = field(default_factory=list)
    blend: dict[str, Any] | None = None  # with rewards.blend: source, rule, judge, judge_variance

    @property
    def masked(self) -> bool:
        """True when a needed scorer failed, so the total is NaN and must be masked."""
        return math.isnan(self.total)


class EpisodeScorer:
    """Scores finished episodes of one scenario with its reward spec (scorers are built once)."""

    def __init__(self, spec: ScenarioSpec, build_scorer):
        self.spec = spec
        self.rewards = spec.rewards
        self._scorers: dict[tuple[str, int], Scorer] = {}
        for layer in LAYERS + ("penalties",):
            for index, scorer_spec in enumerate(getattr(self.rewards, layer)):
                self._scorers[layer, index] = build_scorer(scorer_spec)

    def team_answerer(self, transcript: list[dict]) -> str | None:
        """The agent whose last message is the team's answer."""
        if self.rewards.answer_from is not None:
            return self.rewards.answer_from
        return transcript[-1]["agent"] if transcript else None

    def score_episode(self, task: Task, transcript: list[dict], tool_calls: list[ToolCallRecord],
                      agents: list[str]) -> tuple[dict[str, float], dict[str, RewardBreakdown]]:
        """Per-agent rewards and the breakdown they came from (keyed by agent, or 'team')."""
        item = Item(prompt=task.prompt, answer=task.answer, metadata=dict(task.metadata))
        if self.spec.mode == "cooperative":
            breakdown = self.score_candidate(item, transcript, tool_calls, self.team_answerer(transcript))
            return {agent: breakdown.total for agent in agents}, {"team": breakdown}
        breakdowns = {agent: self.score_candidate(item, transcript, tool_calls, agent) for agent in agents}
        totals = {agent: b.total for agent, b in breakdowns.items()}
        teams = self.spec.teams if self.spec.mode == "mixed" else {agent: [agent] for agent in agents}
        team_totals = {team: statistics.fmean(totals[m] for m in members) for team, members in teams.items()}
        baseline = statistics.fmean(team_totals.values())
        team_of = {member: team for team, members in teams.items() for member in members}
        return {agent: team_totals[team_of[agent]] - baseline for agent in agents}, breakdowns

    def score_candidate(self, item: Item, transcript: list[dict], tool_calls: list[ToolCallRecord],
                        agent: str | None) -> RewardBreakdown:
        """The layered total for the answer of `agent` (None: no answer, every scorer sees '')."""
        components, layer_scores, blended = [], {}, None
        for layer in LAYERS:
            weighted, judgments, undecided = [], {}, False
            for index, scorer_spec in enumerate(getattr(self.rewards, layer)):
                judgment = self._judge(layer, index, scorer_spec, item, transcript, tool_calls, agent)
                components.append(_component(layer, scorer_spec, judgment))
                judgments[scorer_spec.kind] = judgment
                if judgment.ok:
                    weighted.append((scorer_spec.weight, judgment.score))
                undecided = undecided or not judgment.ok
            # one scorer that could not decide leaves its layer undecided: dropping it would let the others
            # decide alone, so a candidate that makes a judge fail (a verdict it cannot parse) would be
            # scored by the rule it passes instead (a layer of weight 0 is never read)
            layer_scores[layer] = _weighted_mean(weighted) if getattr(self.rewards, layer) and not undecided else None
            if layer == "outcome" and self.rewards.blend is not None:
                layer_scores[layer], blended = self._blended_outcome(item, judgments)
        if layer_scores["outcome"] == 1.0 and layer_scores["process"] == 0.0:
            layer_scores["process"] = self.rewards.process_credit_when_correct
        total = self._layered_total(layer_scores)
        penalties = self._penalties(item, transcript, tool_calls, agent)
        total -= sum(p["amount"] for p in penalties if p["applied"])
        if any(p["status"] != "ok" for p in penalties):
            # a penalty scorer that could not decide (a judge's parse error the candidate's text can
            # provoke, an endpoint down) must not drop the penalty: mask the episode, as a failed layer does
            total = float("nan")
        return RewardBreakdown(total=total, layers=layer_scores, components=components, penalties=penalties,
                               blend=blended)

    def own_format_scores(self, task: Task, transcript: list[dict], tool_calls: list[ToolCallRecord],
                          agents: list[str]) -> dict[str, float]:
        """agent -> the format layer alone for its own last message (how well formed it is, whoever answers
        for the team), for each of `agents` that spoke and whose format scorers decided; {} without format
        scorers. Only the format layer is scored: no outcome judge is asked for answers it never grades."""
        if not self.rewards.format:
            return {}
        item = Item(prompt=task.prompt, answer=task.answer, metadata=dict(task.metadata))
        spoke = {turn["agent"] for turn in transcript}
        scores = {}
        for agent in [agent for agent in agents if agent in spoke]:
            weighted = []
            for index, scorer_spec in enumerate(self.rewards.format):
                judgment = self._judge("format", index, scorer_spec, item, transcript, tool_calls, agent)
                if judgment.ok:
                    weighted.append((scorer_spec.weight, judgment.score))
            if weighted:
                scores[agent] = _weighted_mean(weighted)
        return scores

    def _blended_outcome(self, item: Item, judgments: dict[str, Judgment]) -> tuple[float | None, dict]:
        """The outcome of `rewards.blend`: the rule applies to tasks with an answer; a failure masks."""
        spec = self.rewards.blend
        rule = judgments[spec.rule] if item.answer is not None else None
        judge = judgments[spec.judge]
        result = blend_group([rule], [judge], mode=spec.mode, weights=spec.weights)[0]
        variance = judgment_variance(judge, spec.default_variance) if judge.ok else None
        details = {"source": result.source, "rule": result.rule, "judge": result.judge_raw, "judge_variance": variance}
        return (None if result.masked else result.value), details

    def _layered_total(self, layer_scores: dict[str, float | None]) -> float:
        total, weights = 0.0, 0.0
        for layer in LAYERS:
            weight = getattr(self.rewards.weights, layer)
            if getattr(self.rewards, layer) and weight > 0:
                score = layer_scores[layer]
                if score is None:
                    return float("nan")  # every scorer of a needed layer failed: mask, never 0
                total, weights = total + weight * score, weights + weight
        return total / weights if self.rewards.normalize and weights > 0 else total

    def _penalties(self, item, transcript, tool_calls, agent) -> list[dict[str, Any]]:
        applied = []
        for index, penalty in enumerate(self.rewards.penalties):
            judgment = self._judge("penalties", index, penalty, item, transcript, tool_calls, agent)
            hit = judgment.ok and judgment.score < 1.0
            applied.append({"kind": penalty.kind, "amount": penalty.amount, "applied": hit,
                            "status": judgment.status, "rationale": judgment.rationale})
        return applied

    def _judge(self, layer, index, scorer_spec: ScorerSpec, item, transcript, tool_calls, agent) -> Judgment:
        who = scorer_spec.agent or agent
        candidate = build_candidate(transcript, tool_calls, who)
        return self._scorers[layer, index].score(item, [candidate])[0]


def build_candidate(transcript: list[dict], tool_calls: list[ToolCallRecord], agent: str | None) -> Candidate:
    """The candidate for `agent`: its last message as the answer, the whole transcript as reasoning."""
    own = [turn["text"] for turn in transcript if turn["agent"] == agent]
    reasoning = "\n".join(f"{turn['agent']}: {turn['text']}" for turn in transcript)
    return Candidate(text=own[-1] if own else "", reasoning=reasoning,
                     transcript=tuple({"agent": t["agent"], "text": t["text"], "turn": t["turn"]} for t in transcript),
                     tool_calls=tuple(tool_calls), agent=agent)


def _weighted_mean(pairs: list[tuple[float, float]]) -> float | None:
    weight = sum(w for w, _ in pairs)
    if not pairs:
        return None
    if weight == 0:
        return statistics.fmean(score for _, score in pairs)
    return sum(w * score for w, score in pairs) / weight


def _component(layer: str, scorer_spec: ScorerSpec, judgment: Judgment) -> dict[str, Any]:
    return {"layer": layer, "kind": scorer_spec.kind, "weight": scorer_spec.weight, "status": judgment.status,
            "score": judgment.score, "rationale": judgment.rationale}
