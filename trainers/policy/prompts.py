"""What a model sees of an agent's turn, where its answer stops, and the text it said.

Every place a model meets a turn renders it here: RL acting, `marl eval` and `marl rollout` (through
`ModelActor.act`), the SFT warm-up's demonstrations, and `EndpointActor`'s messages. The rendering
itself is `judges.model.chat.render_chat`, the one `marl serve` applies to its clients' messages, so
a checkpoint is served with the prompts it was trained on.

    chat template, mode auto    system = the agent's role (skipped when empty), user = the observation,
                                then the assistant's generation prompt
    no template, or mode none   the observation itself (the embedded character model: prompts as before)

The mode is the agent's `chat_template`, else the scenario's (`auto|none`, default auto). In plain
text the role is not prepended: the observation template already shows it where the scenario wants
it ({role}), and the character model's prompts stay exactly what they were.
"""

from __future__ import annotations

from dataclasses import dataclass

from judges.model.chat import end_of_turn_id, render_chat, stop_token_ids, uses_template

__all__ = ["TurnStyle", "agent_styles", "decode_turns", "demonstration", "stop_token_ids", "turn_messages",
           "turn_prompt", "turn_prompts"]


@dataclass(frozen=True)
class TurnStyle:
    """How one agent's turns are rendered: its role (the system message) and the chat-template mode."""

    role: str = ""
    mode: str = "auto"


DEFAULT_STYLE = TurnStyle()  # an agent a table does not know: no role, the template when there is one


def agent_styles(spec) -> dict[str, TurnStyle]:
    """agent name -> TurnStyle of a ScenarioSpec (an agent's chat_template, else the scenario's)."""
    return {agent.name: TurnStyle(agent.role, agent.chat_template or spec.chat_template) for agent in spec.agents}


def turn_messages(observation: str, style: TurnStyle = DEFAULT_STYLE) -> list[dict]:
    """The chat messages of a turn: the role as the system message (unless empty), the observation as the user's."""
    system = [{"role": "system", "content": style.role}] if style.role.strip() else []
    return system + [{"role": "user", "content": observation}]


def turn_prompt(tokenizer, observation: str, style: TurnStyle = DEFAULT_STYLE) -> str:
    """The prompt text of one turn for `tokenizer` (see the module docstring)."""
    if uses_template(tokenizer, style.mode):
        return render_chat(tokenizer, turn_messages(observation, style), style.mode)
    # plain text: the observation alone; a prompt needs at least one token, hence " " for an empty one
    return render_chat(tokenizer, [{"role": "user", "content": observation}], "none") or " "


def turn_prompts(tokenizer, requests, styles: dict[str, TurnStyle] | None = None) -> list[str]:
    """The prompts of actor requests `(agent, observation, task)`, each in its agent's style."""
    styles = styles or {}
    return [turn_prompt(tokenizer, observation, styles.get(agent, DEFAULT_STYLE)) for agent, observation, _ in requests]


def demonstration(tokenizer, observation: str, message: str, style: TurnStyle = DEFAULT_STYLE) -> tuple[str, str, int]:
    """An SFT example `(prompt, answer, end id)`: the turn's prompt as the model sees it when acting, the
    expert's message, and the token that ends it (the template's end of turn, else eos)."""
    end = end_of_turn_id(tokenizer) if uses_template(tokenizer, style.mode) else tokenizer.eos_token_id
    return turn_prompt(tokenizer, observation, style), message, end


def decode_turns(tokenizer, completions) -> list[str]:
    """The texts of sampled completions, cut before the stop token that ended each row.

    A row that stopped ends with its stop token (the mask includes it); it is dropped before
    decoding, so an end token that is not a special token never reaches the environment either.
    """
    texts = []
    for ids, mask, truncated in zip(completions.completion_ids.tolist(), completions.completion_mask.tolist(),
                                    completions.truncated.tolist()):
        kept = [token for token, keep in zip(ids, mask) if keep]
        if kept and not truncated:
            kept = kept[:-1]
        texts.append(tokenizer.decode(kept, skip_special_tokens=True))
    return texts
