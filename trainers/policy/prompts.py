"""What a model sees of an agent's turn, where its answer stops, and the text it said.

Every place a model meets a turn renders it here: RL acting, `marl eval` and `marl rollout` (through
`ModelActor.act`), the SFT warm-up's demonstrations, and `EndpointActor`'s messages. The rendering
itself is `common.chat.render_chat`, the one `marl serve` applies to its clients' messages, so
a checkpoint is served with the prompts it was trained on.

    chat template, mode auto    system = the agent's role (skipped when empty), user = the observation,
                                then the assistant's generation prompt
    no template, or mode none   the observation itself

The mode is the agent's `chat_template`, else the scenario's (`auto|none`, default auto). In plain
text the role is not prepended: the observation template already shows it where the scenario wants
it ({role}). The embedded tiny model (trainers/policy/tinylm.py) has a ChatML template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from common.chat import end_of_turn_id, render_chat, stop_token_ids, uses_template
from common.files import read_user_text
from marl.env import CUT_MARK, keep_ends

__all__ = ["ChatTemplateError", "TurnStyle", "agent_styles", "context_problem", "decode_turns", "demonstration",
           "directory_context", "fit_turn_prompts", "heard_tokens", "model_context", "prompt_limit", "stop_token_ids",
           "template_problem", "turn_messages", "turn_prompt", "turn_prompts"]


@dataclass(frozen=True)
class TurnStyle:
    """How one agent's turns are rendered: its role (the system message) and the chat-template mode,
    and the lengths its prompts are fitted to (not part of how a turn looks, so not compared)."""

    role: str = ""
    mode: str = "auto"
    max_tokens: int | None = field(default=None, compare=False)  # the agent's answer budget
    max_prompt_tokens: int | None = field(default=None, compare=False)  # None: the context minus max_tokens


DEFAULT_STYLE = TurnStyle()  # an agent a table does not know: no role, the template when there is one


def agent_styles(spec) -> dict[str, TurnStyle]:
    """agent name -> TurnStyle of a ScenarioSpec (an agent's chat_template, else the scenario's)."""
    return {agent.name: TurnStyle(agent.role, agent.chat_template or spec.chat_template, agent.max_tokens,
                                  spec.max_prompt_tokens) for agent in spec.agents}


def turn_messages(observation: str, style: TurnStyle = DEFAULT_STYLE) -> list[dict]:
    """The chat messages of a turn: the role as the system message (unless empty), the observation as the user's."""
    system = [{"role": "system", "content": style.role}] if style.role.strip() else []
    return system + [{"role": "user", "content": observation}]


class ChatTemplateError(ValueError):
    """A model's chat template that fails to render an agent's turn (one line: the model, the error, the fix)."""


def turn_prompt(tokenizer, observation: str, style: TurnStyle = DEFAULT_STYLE) -> str:
    """The prompt text of one turn for `tokenizer` (see the module docstring); ChatTemplateError when the
    tokenizer's chat template fails on it (a template may raise, or use what the messages do not have)."""
    if uses_template(tokenizer, style.mode):
        try:
            return render_chat(tokenizer, turn_messages(observation, style), style.mode)
        except Exception as error:  # noqa: BLE001 - jinja raises many kinds; all mean "this template fails"
            raise ChatTemplateError(_template_failure(tokenizer, error)) from None
    # plain text: the observation alone; a prompt needs at least one token, hence " " for an empty one
    return render_chat(tokenizer, [{"role": "user", "content": observation}], "none") or " "


def _template_failure(tokenizer, error: Exception, agent: str | None = None) -> str:
    reason = " ".join(str(error).split())[:200]
    turn = f"the turn of agent {agent!r}" if agent is not None else "a turn"
    return (f"{getattr(tokenizer, 'name_or_path', '') or 'the model'}: its chat template fails to render {turn} "
            f"({type(error).__name__}: {reason}); fix chat_template.jinja (or tokenizer_config.json's chat_template), "
            "or set chat_template: none (the scenario's or the agent's) to prompt in plain text")


def template_problem(tokenizer, styles: dict[str, TurnStyle]) -> str | None:
    """One line when the tokenizer's chat template fails on a turn of one of `styles` (agent -> TurnStyle),
    rendered as the agent's turns are (its role as the system message); None when every one renders. A
    model is checked with it when its actor is built, before anything plays."""
    for agent, style in styles.items():
        if uses_template(tokenizer, style.mode):
            try:
                render_chat(tokenizer, turn_messages("1+2=", style), style.mode)
            except Exception as error:  # noqa: BLE001 - jinja raises many kinds; all mean "this template fails"
                return _template_failure(tokenizer, error, agent)
    return None


def turn_prompts(tokenizer, requests, styles: dict[str, TurnStyle] | None = None) -> list[str]:
    """The prompts of actor requests `(agent, observation, task)`, each in its agent's style."""
    return fit_turn_prompts(tokenizer, requests, styles)[0]  # no context: only max_prompt_tokens fits them


def prompt_limit(style: TurnStyle, context: int | None) -> int | None:
    """The most prompt tokens of a turn in `style`: max_prompt_tokens, else what the model's `context`
    leaves after the agent's max_tokens (at least 1); None when neither is known (no fitting)."""
    if style.max_prompt_tokens is not None:
        return style.max_prompt_tokens
    if context is None or style.max_tokens is None:
        return None
    return max(1, context - style.max_tokens)


def _token_count(tokenizer, prompt: str) -> int:
    return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])  # as encode_prompts tokenises


def _fit(tokenizer, observation: str, style: TurnStyle, limit: int | None) -> tuple[str, bool]:
    """(prompt, cut): the turn's prompt, its observation's middle dropped until it has <= limit tokens.

    The longest kept observation whose prompt fits is found by bisection on its length in characters
    (a shorter keep_ends never has more tokens, up to a merge at the cut). The head kept is the
    environment's (before its CUT_MARK, up to marl.env.HEAD_SHARE of what is kept) when it cut already,
    else half of what is kept.
    """
    prompt = turn_prompt(tokenizer, observation, style)
    if limit is None or _token_count(tokenizer, prompt) <= limit:
        return prompt, CUT_MARK in observation  # cut (or not) by the environment only
    marked = CUT_MARK in observation  # the environment's head ends at its mark: keep_ends keeps it whole
    kept = lambda chars: keep_ends(observation, chars, chars if marked else chars // 2)  # noqa: E731
    low, high = 0, len(observation) - 1  # characters kept: low always fits (or nothing does)
    while low < high:
        middle = (low + high + 1) // 2
        if _token_count(tokenizer, turn_prompt(tokenizer, kept(middle), style)) <= limit:
            low = middle
        else:
            high = middle - 1
    return turn_prompt(tokenizer, kept(low), style), True


def fit_turn_prompts(tokenizer, requests, styles: dict[str, TurnStyle] | None = None,
                     context: int | None = None) -> tuple[list[str], list[bool]]:
    """The prompts of actor requests `(agent, observation, task)`, each in its agent's style and fitted
    to its `prompt_limit` for a model of `context` positions, and whether each was cut (by the fit or
    already by the environment, which marks its cut with CUT_MARK)."""
    styles = styles or {}
    fitted = [_fit(tokenizer, observation, style, prompt_limit(style, context))
              for style, observation in ((styles.get(agent, DEFAULT_STYLE), observation)
                                         for agent, observation, _ in requests)]
    return [prompt for prompt, _ in fitted], [cut for _, cut in fitted]


def model_context(model) -> int | None:
    """The positions a model (or its config) can attend to: max_position_embeddings or n_positions."""
    config = getattr(model, "config", model)
    for source in (config, getattr(config, "text_config", None)):
        for key in ("max_position_embeddings", "n_positions"):
            value = getattr(source, key, None) if not isinstance(source, dict) else source.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


def directory_context(directory) -> int | None:
    """model_context of a Hugging Face model directory's config.json (None when it names none)."""
    try:  # bounded, and never a FIFO or device (a read that would not end)
        return model_context(json.loads(read_user_text(Path(directory) / "config.json", max_bytes=16 << 20)))
    except (OSError, ValueError, RecursionError):
        return None


def context_problem(spec, context: int | None) -> str | None:
    """One line when an agent the base model plays cannot fit its prompt and answer in `context`
    positions, else None (also when the context is unknown).

    The prompt term is `max_prompt_tokens`; unset, the prompt is fitted to whatever the context leaves
    after max_tokens, so only max_tokens must leave room.
    """
    if context is None:
        return None
    fix, prompt = "use a model with a longer context", spec.max_prompt_tokens
    for index, agent in enumerate(spec.agents):
        if agent.policy not in ("shared", "own"):
            continue  # scripted, endpoint and own-directory agents do not play this model
        name = f"agents.{index}.max_tokens"
        if prompt is None and agent.max_tokens >= context:
            return (f"{name}={agent.max_tokens} leaves no room for a prompt in the model's context of {context} "
                    f"tokens; lower {name}, or {fix}")
        if prompt is not None and prompt + agent.max_tokens > context:
            return (f"{name}={agent.max_tokens} + max_prompt_tokens={prompt} = {prompt + agent.max_tokens} tokens "
                    f"is more than the model's context of {context}; lower max_prompt_tokens or {name}, or {fix}")
    return None


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


def heard_tokens(tokenizer, ids: list[int], max_chars: int) -> int:
    """How many of a completion's leading tokens `ids` the environment hears when it keeps a message's
    first `max_chars` characters: a token is heard when the text before it is shorter than that (a
    token cut in two is heard). Bisection on the decoded prefix's length (it grows with the prefix)."""
    low, high = 1, len(ids)  # the first token always starts within the message (max_chars >= 1)
    while low < high:
        middle = (low + high + 1) // 2
        if len(tokenizer.decode(ids[:middle - 1], skip_special_tokens=True)) < max_chars:
            low = middle
        else:
            high = middle - 1
    return min(low, len(ids))
