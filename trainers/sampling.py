"""Batched sampling with a KV cache, and the per-token logprobs GRPO trains on.

Both functions share one idea: the G samples of a prompt share its prefix, so the prompt is run once
per *unique* prompt and its KV cache is repeated G times. In generation this saves the prefill; in
training (`completion_logprobs`) it also saves the prompt's share of forward and backward, and the
gradient is the same because repeating the cache is differentiable (the G copies' gradients add up).

Shapes: N = prompts x G sequences, P = prompt length (left-padded), C = completion length.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch


@dataclass
class Completions:
    """A batch of sampled completions, G per prompt, grouped contiguously.

    prompt_ids, prompt_mask: (N, P) left-padded prompts.
    completion_ids: (N, C) sampled tokens, padding after EOS.
    completion_mask: (N, C) 1 up to and including the first EOS.
    logprobs: (N, C) logprobs of the sampled tokens at logits / temperature, 0 on padding.
    truncated: (N,) True where no EOS appeared within max_new_tokens.
    entropy: (N, C) entropy of the sampling distribution at each step (a free diagnostic).
    prompt_index: (N,) which prompt each row answers (rows of one prompt share its KV cache).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    logprobs: torch.Tensor
    truncated: torch.Tensor
    entropy: torch.Tensor
    prompt_index: torch.Tensor
    group_size: int


def encode_prompts(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenise prompts (no special tokens added) into left-padded ids and attention mask."""
    if not prompts:
        raise ValueError("encode_prompts needs at least one prompt")
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(len(ids) for ids in encoded)
    if width == 0:
        raise ValueError("every prompt tokenised to zero tokens; a prompt must have at least one token")
    ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, tokens in enumerate(encoded):
        if tokens:
            ids[row, width - len(tokens):] = torch.tensor(tokens)
            mask[row, width - len(tokens):] = 1
    return ids, mask


def _cache_name(model) -> str:
    """The KV-cache keyword of this model's forward: `cache` (transformers >= 5.2x) or `past_key_values`."""
    name = getattr(model, "_marl_cache_kwarg", None)
    if name is None:
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        model._marl_cache_kwarg = name
    return name


def _forward_with_cache(model, cache, **inputs):
    """One forward that reads and extends `cache`; returns (output, cache)."""
    name = _cache_name(model)
    out = model(**inputs, **{name: cache}, use_cache=True)
    return out, getattr(out, name)


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore left padding: 0 at each row's first real token."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _prefill(model, prompt_ids, prompt_mask, row_prompt):
    """Run each unique prompt once; return the KV cache and last-token logits laid out per row.

    `row_prompt[i]` is the index (into prompt_ids) of row i's prompt. Selecting cache rows is an index
    operation, so gradients of the G copies flow back into the single prompt computation.
    """
    out, cache = _forward_with_cache(model, None, input_ids=prompt_ids, attention_mask=prompt_mask,
                                     position_ids=_positions(prompt_mask), logits_to_keep=1)
    cache.batch_select_indices(row_prompt)
    return cache, out.logits[:, -1][row_prompt]


def _pick_tokens(logits, temperature, top_p, greedy, generator):
    """Choose the next token per row; return it, its logprob at logits / temperature, and the entropy."""
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    if greedy:
        tokens = logprobs.argmax(-1)
    else:
        probs = logprobs.exp()
        if top_p < 1.0:
            sorted_probs, order = probs.sort(-1, descending=True)
            drop = sorted_probs.cumsum(-1) - sorted_probs > top_p  # keep the smallest set reaching top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1), entropy


@torch.no_grad()
def sample_completions(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, group_size: int = 1,
                       max_new_tokens: int = 16, temperature: float = 1.0, top_p: float = 1.0,
                       greedy: bool = False, eos_token_id: int, pad_token_id: int,
                       generator: torch.Generator | None = None) -> Completions:
    """Sample `group_size` completions per prompt with a KV cache, stopping rows at EOS.

    Rows that finished are dropped from the cache once a quarter of the running rows are done, and
    generation stops when every row has produced EOS (or after max_new_tokens). `greedy=True` takes
    the argmax (evaluation at temperature 0). Pass a seeded `generator` for reproducibility.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (use greedy=True for temperature 0)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    rows_prompt = torch.arange(prompt_ids.size(0)).repeat_interleave(group_size)
    cache, logits = _prefill(model, prompt_ids, prompt_mask, rows_prompt)
    n = logits.size(0)
    running = torch.arange(n)  # rows still in the cache, in cache order
    attention = prompt_mask[rows_prompt]
    position = attention.sum(-1, keepdim=True)
    done = torch.zeros(n, dtype=torch.bool)
    steps = []  # per step: (tokens, logprobs, entropy, mask) over all n rows
    for _ in range(max_new_tokens):
        picked, logprobs, entropy = _pick_tokens(logits, temperature, top_p, greedy, generator)
        finished = done[running]
        steps.append(_scatter_step(n, running, picked.masked_fill(finished, pad_token_id),
                                   logprobs.masked_fill(finished, 0.0), entropy.masked_fill(finished, 0.0),
                                   ~done, pad_token_id))
        done[running] |= picked == eos_token_id
        if bool(done.all()):
            break
        alive = ~done[running]
        if int(alive.sum()) <= 0.75 * running.numel():
            keep = alive.nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            running, attention, position, picked = running[keep], attention[keep], position[keep], picked[keep]
        attention = torch.cat([attention, torch.ones((attention.size(0), 1), dtype=attention.dtype)], dim=1)
        out, cache = _forward_with_cache(model, cache, input_ids=picked[:, None], attention_mask=attention,
                                         position_ids=position)
        logits, position = out.logits[:, -1], position + 1
    tokens, logprobs, entropy, mask = (torch.stack(column, 1) for column in zip(*steps))
    return Completions(prompt_ids=prompt_ids[rows_prompt], prompt_mask=prompt_mask[rows_prompt],
                       completion_ids=tokens, completion_mask=mask.long(), logprobs=logprobs,
                       truncated=~done, entropy=entropy, prompt_index=rows_prompt, group_size=group_size)


def _scatter_step(n, running, tokens, logprobs, entropy, mask, pad_token_id):
    """One generation step's values for the running rows, laid out over all n rows."""
    full_tokens = torch.full((n,), pad_token_id, dtype=tokens.dtype).index_copy(0, running, tokens)
    full_logprobs = torch.zeros(n, dtype=logprobs.dtype).index_copy(0, running, logprobs)
    full_entropy = torch.zeros(n, dtype=entropy.dtype).index_copy(0, running, entropy)
    return full_tokens, full_logprobs, full_entropy, mask.clone()


def length_chunks(lengths: list[int], max_chunks: int = 3, call_cost: int = 64) -> list[tuple[list[int], int]]:
    """Split rows into at most `max_chunks` groups of similar completion length.

    Each chunk is run at the width of its longest row, so short rows stop paying for long ones; a
    chunk costs `call_cost` token-equivalents of overhead (a model call and a prefill). Returns
    [(row indices, width)] minimising sum(rows x (width - 1)) + call_cost x chunks.
    """
    distinct = sorted(set(lengths))
    count = {length: lengths.count(length) for length in distinct}

    def cost(a, b):  # one chunk holding distinct[a..b]
        return sum(count[d] for d in distinct[a:b + 1]) * (distinct[b] - 1) + call_cost

    best = (cost(0, len(distinct) - 1), [len(distinct) - 1])
    for i in range(len(distinct) - 1):
        best = min(best, (cost(0, i) + cost(i + 1, len(distinct) - 1), [i, len(distinct) - 1]))
        if max_chunks >= 3:
            for j in range(i + 1, len(distinct) - 1):
                split = cost(0, i) + cost(i + 1, j) + cost(j + 1, len(distinct) - 1)
                best = min(best, (split, [i, j, len(distinct) - 1]))
    chunks, low = [], 0
    for high in best[1]:
        members = set(distinct[low:high + 1])
        chunks.append(([r for r, length in enumerate(lengths) if length in members], distinct[high]))
        low = high + 1
    return chunks


def _chunk_logprobs(model, completions: Completions, rows: torch.Tensor, width: int, temperature: float):
    """Logprobs (len(rows), width) of the first `width` completion tokens of the given rows."""
    unique, row_prompt = torch.unique(completions.prompt_index[rows], return_inverse=True)
    first = torch.full((unique.numel(),), rows.numel()).scatter_reduce(0, row_prompt, torch.arange(rows.numel()),
                                                                     reduce="amin")
    first_rows = rows[first]  # one representative row per unique prompt
    cache, first_logits = _prefill(model, completions.prompt_ids[first_rows],
                                   completions.prompt_mask[first_rows], row_prompt)
    ids = completions.completion_ids[rows, :width]
    logits = first_logits[:, None]
    if width > 1:
        prompt_mask = completions.prompt_mask[rows]
        attention = torch.cat([prompt_mask, torch.ones((rows.numel(), width - 1), dtype=prompt_mask.dtype)], 1)
        positions = prompt_mask.sum(-1, keepdim=True) + torch.arange(width - 1)
        out, _ = _forward_with_cache(model, cache, input_ids=ids[:, :-1], attention_mask=attention,
                                     position_ids=positions)
        logits = torch.cat([logits, out.logits], dim=1)
    return torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, ids[..., None]).squeeze(-1)


def completion_logprobs(model, completions: Completions, temperature: float = 1.0) -> torch.Tensor:
    """Per-token logprobs (N, C) of the completions under `model` at logits / temperature.

    Differentiable. Each unique prompt is run once with its cache shared over its group, and rows are
    run in chunks of similar length (`length_chunks`) so that padding costs little. Positions past a
    row's chunk width are 0; callers multiply by the completion mask.
    """
    n, width = completions.completion_ids.shape
    lengths = completions.completion_mask.sum(-1).clamp(min=1).tolist()
    parts, order = [], []
    for rows, chunk_width in length_chunks(lengths):
        rows = torch.tensor(rows)
        logprobs = _chunk_logprobs(model, completions, rows, chunk_width, temperature)
        parts.append(torch.nn.functional.pad(logprobs, (0, width - chunk_width)))
        order.append(rows)
    stacked = torch.cat(parts)
    return stacked[torch.argsort(torch.cat(order))]


def full_sequence_logprobs(model, completions: Completions, temperature: float = 1.0) -> torch.Tensor:
    """The same logprobs as `completion_logprobs`, from one plain forward over prompt + completion.

    Slower (the prompt runs G times, every row at full width) but the textbook computation; tests
    compare the two.
    """
    ids = torch.cat([completions.prompt_ids, completions.completion_ids], dim=1)
    mask = torch.cat([completions.prompt_mask, torch.ones_like(completions.completion_ids)], dim=1)
    steps = completions.completion_ids.size(1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), logits_to_keep=steps + 1)
    logprobs_all = torch.log_softmax(out.logits[:, :-1].float() / temperature, dim=-1)
    return logprobs_all.gather(-1, completions.completion_ids[..., None]).squeeze(-1)


def decode_completions(tokenizer, completions: Completions) -> list[str]:
    """Completion texts without special tokens (EOS and padding dropped)."""
    texts = []
    for ids, mask in zip(completions.completion_ids.tolist(), completions.completion_mask.tolist()):
        kept = [t for t, m in zip(ids, mask) if m]
        texts.append(tokenizer.decode(kept, skip_special_tokens=True))
    return texts
