"""How a chat model's turn is rendered and where its answer stops: the one rendering of every prompt.

    render_chat(tokenizer, messages, mode)   messages -> the prompt text (the chat template, or plain text)
    uses_template(tokenizer, mode)           whether that rendering applies the tokenizer's chat template
    end_of_turn_id(tokenizer)                the token that closes an assistant turn (ChatML: <|im_end|>)
    stop_token_ids(model, tokenizer)         every id generation stops at
    ensure_pad_token(tokenizer)              a pad token (eos when it has none), or a one-line ValueError
    check_model_dir(path)                    a model directory's problem, said in one line, before loading

`marl serve` and the local judge backend (judges/model/local_backend.py) render client messages with
`render_chat`; the trainers render an agent's turn (role = system, observation = user) with it too
(trainers/policy/prompts.py), so a model is trained, evaluated and served with the same prompts.
Nothing here imports torch or transformers at import time, only inside `check_model_dir`, so that importing
this module (as judges, marl serve and the torch-free trainer modules do) loads no heavy library.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from common.model_files import SAVE_FIX, model_folder_problem, shape_problem

CHAT_MODES = ("auto", "none")  # marl.options.CHAT_TEMPLATE_MODES; common may not import marl
_MARK = "\u2063marl-end-of-turn\u2063"  # an assistant message no template rewrites, to find what follows it


def uses_template(tokenizer, mode: str = "auto") -> bool:
    """True when `render_chat` applies the tokenizer's chat template: mode auto and a template exists."""
    if mode not in CHAT_MODES:
        raise ValueError(f"chat_template mode {mode!r}: expected one of {', '.join(CHAT_MODES)}")
    return mode == "auto" and bool(getattr(tokenizer, "chat_template", None))


def render_chat(tokenizer, messages: list[dict], mode: str = "auto") -> str:
    """The prompt text of `messages` ({role, content} dicts) for the model to answer.

    mode auto with a tokenizer that has a chat template: the template, with the assistant's
    generation prompt appended. Otherwise (mode none, or no template, like the embedded character
    model): the messages' contents joined by newlines.
    """
    if uses_template(tokenizer, mode):
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return "\n".join(m["content"] for m in messages)


def end_of_turn_id(tokenizer) -> int | None:
    """The token the chat template closes an assistant message with, else the tokenizer's eos.

    Found by rendering a marked assistant message: the first token after the mark, when it is a
    special token (ChatML's <|im_end|>, Llama 3's <|eot_id|>). A template that ends turns with plain
    text, or that cannot render an assistant turn, falls back to eos.
    """
    eos = tokenizer.eos_token_id
    if not getattr(tokenizer, "chat_template", None):
        return eos
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}],
                                             tokenize=False)
    except Exception:  # noqa: BLE001 - templates raise their own kinds (jinja TemplateError, ValueError)
        return eos
    if not isinstance(text, str) or _MARK not in text:
        return eos
    after = tokenizer(text.split(_MARK, 1)[1], add_special_tokens=False)["input_ids"]
    special = set(getattr(tokenizer, "all_special_ids", ()))
    special |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return after[0] if after and after[0] in special else eos


def _ids(value) -> list[int]:
    """An eos setting (None, an int, or a list of ints) as a list."""
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value] if isinstance(value, Iterable) else []


def stop_token_ids(model, tokenizer) -> list[int]:
    """Every id generation stops at: the model's generation_config eos (an int or a list, e.g.
    Qwen2.5-Instruct's [<|im_end|>, <|endoftext|>]), the tokenizer's eos and its end-of-turn token.

    Order kept, duplicates dropped. An instruct model ends its turn with <|im_end|> even when the
    tokenizer's eos is <|endoftext|>: stopping at eos alone would let it run on past its answer.
    """
    config = getattr(model, "generation_config", None)
    found = _ids(getattr(config, "eos_token_id", None)) + _ids(tokenizer.eos_token_id) + _ids(end_of_turn_id(tokenizer))
    if not found:
        raise ValueError("the model has no end token: its generation_config and its tokenizer set no eos_token_id "
                         "(set tokenizer.eos_token and save the tokenizer again)")
    return list(dict.fromkeys(found))


def ensure_pad_token(tokenizer, log=None):
    """The tokenizer with a pad token: its own, else its eos (as is common), else a one-line ValueError."""
    if tokenizer.pad_token_id is not None:
        return tokenizer
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has neither a pad token nor an eos token: set tokenizer.eos_token (and "
                         "optionally pad_token) and save it again with save_pretrained")
    tokenizer.pad_token = tokenizer.eos_token
    if log is not None:
        log(f"tokenizer: no pad token, padding with eos {tokenizer.eos_token!r}")
    return tokenizer


def check_model_dir(path: str | Path) -> str | None:
    """What is wrong with a model directory, in one line naming the fix; None when it loads.

    Reads the files' headers (common/model_files.py: special files, pickle or damaged weights, no
    tokenizer, a config.json that does not match the weights), config.json and the tokenizer, never
    the weights, so a bad directory is refused before any weights are loaded or anything trains.
    """
    from transformers import AutoConfig, AutoTokenizer  # lazy: importing common.chat loads no heavy library

    path = Path(path)
    if (problem := model_folder_problem(path, require_weights=False)) is not None:  # no weights: the loader says
        return problem
    for what, load in (("config.json", AutoConfig.from_pretrained), ("tokenizer", AutoTokenizer.from_pretrained)):
        try:
            loaded = load(path)
        except Exception as error:  # noqa: BLE001 - transformers raises many kinds; all mean "cannot load"
            message = " ".join(str(error).split())[:200]
            return f"{path}: the {what} does not load ({type(error).__name__}: {message}); {SAVE_FIX}"
    if loaded.pad_token_id is None and loaded.eos_token_id is None:
        return (f"{path}: the tokenizer has neither a pad token nor an eos token; set tokenizer.eos_token "
                "(and optionally pad_token) and save the tokenizer again")
    return shape_problem(path)
