"""Batched sampling with a KV cache, and the per-token logprobs GRPO trains on.

Both avoid computing the same thing twice, exactly:
- `sample_completions` prefills each distinct prompt once (the G samples of a prompt, and identical
  prompts of different rows, start from one prefill), then decodes every row in one batch with its
  keys and values written in place (trainers/policy/kv_cache.py).
- `completion_logprobs` packs each prompt once followed by the completions of its rows into one
  sequence with a block attention mask, so the prompt's forward and backward are shared by its rows
  and short completions pay no padding. Gradients equal those of the plain per-row forward
  (`full_sequence_logprobs`, kept as the reference the tests compare against).

Shapes: N = prompts x G sequences, P = prompt length (left-padded), C = completion length.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from marl.options import PACKINGS
from marl.rollout import stream_key  # noqa: F401 - the one key function; re-exported for callers
from trainers.policy.loading import compute_dtype, model_device

@dataclass
class Completions:
    """A batch of sampled completions; `prompt_index` says which prompt each row answers.

    prompt_ids, prompt_mask: (N, P) left-padded prompts.
    completion_ids: (N, C) sampled tokens, padding after EOS.
    completion_mask: (N, C) 1 up to and including the first EOS.
    logprobs: (N, C) logprobs of the sampled tokens at logits / temperature, 0 on padding.
    truncated: (N,) True where no EOS appeared within max_new_tokens.
    entropy: (N, C) entropy of the sampling distribution at each step (a free diagnostic).
    prompt_index: (N,) which prompt each row answers (rows of one prompt share its KV cache).
    prompt_cut: (N,) bool, True where the row's prompt was cut to fit its token limit (set by the actor
        that fitted the prompts, `ModelActor.act`; None when nothing fitted them).
    version: (N,) the published policy version that sampled each row (trainers/engine: an HTTP engine's
        adapter version; None when the live weights of this process sampled it).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    logprobs: torch.Tensor
    truncated: torch.Tensor
    entropy: torch.Tensor
    prompt_index: torch.Tensor
    prompt_cut: torch.Tensor | None = None
    version: torch.Tensor | None = None


def encode_prompts(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenise prompts (no special tokens added) into left-padded ids and attention mask."""
    if not prompts:
        raise ValueError("encode_prompts needs at least one prompt")
    return encode_ids([tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts], tokenizer.pad_token_id)


def encode_ids(encoded: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id prompts as left-padded ids and attention mask (a ValueError when every prompt is empty)."""
    width = max(len(ids) for ids in encoded)
    if width == 0:
        raise ValueError("every prompt tokenised to zero tokens; a prompt must have at least one token")
    ids = torch.full((len(encoded), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, tokens in enumerate(encoded):
        if tokens:
            ids[row, width - len(tokens):] = torch.tensor(tokens)
            mask[row, width - len(tokens):] = 1
    return ids, mask


def _cache_name(model) -> str:
    """The KV-cache keyword of this model's forward: `cache` (transformers >= 5.2x) or `past_key_values`."""
    name = getattr(model, "_marl_cache_kwarg", None)
    if name is None:  # a peft model's forward takes **kwargs: its base model's signature says
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        name = "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"
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


def keyed_uniforms(keys: Sequence[int], position: int) -> torch.Tensor:
    """One uniform in [0, 1) per key for token `position`: splitmix64 of (key, position), a counter-based
    generator, so a row's draws depend on its key and position only, never on the call order, the
    batch it is in or the process that samples it (what the Ray backend needs to reproduce local runs)."""
    import numpy as np

    with np.errstate(over="ignore"):  # uint64 arithmetic wraps modulo 2**64 by design
        z = np.asarray(keys, dtype=np.uint64) + np.uint64(position + 1) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return torch.from_numpy((z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53)


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the token whose cumulative weight first exceeds u times the row's total (weights need
    not sum to 1; a token of weight 0 is never picked): an exact draw from the row's distribution."""
    cdf = probs.double().cumsum(-1)
    targets = (uniforms.to(cdf.device) * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, targets, right=True).squeeze(-1).clamp(max=probs.size(-1) - 1)


def _pick_tokens(logits, temperature, top_p, greedy, generator, uniforms=None):
    """Choose the next token per row; return it, its logprob at logits / temperature, and the entropy of
    the distribution it was drawn from (greedy: a point mass, entropy 0, and no softmax over the whole
    vocabulary, only the log-normaliser). With `uniforms` (one per row, `keyed_uniforms`) the draw is by
    inverse CDF, else from `generator`."""
    scaled = logits.float() / temperature if temperature != 1.0 else logits.float()
    if greedy:
        tokens = scaled.argmax(-1)
        picked = scaled.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
        return tokens, picked, torch.zeros_like(picked)
    logprobs = torch.log_softmax(scaled, dim=-1)
    probs = logprobs.exp()
    nucleus = _nucleus(probs, top_p)
    if uniforms is not None:
        tokens = _inverse_cdf(nucleus, uniforms)
    else:
        tokens = torch.multinomial(nucleus, 1, generator=generator).squeeze(-1)
    entropy = -(probs * logprobs).sum(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1), entropy


def _nucleus(probs, top_p: float):
    """`probs` with every token outside the nucleus set to 0 (the smallest set reaching top_p; not
    renormalised: torch.multinomial takes weights); `probs` itself when top_p is 1."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(-1, descending=True)
    drop = sorted_probs.cumsum(-1) - sorted_probs > top_p  # keep the smallest set reaching top_p
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))


def sampling_probabilities(logits, temperature: float = 1.0, top_p: float = 1.0):
    """The distribution `_pick_tokens` draws the next token from (not greedy): softmax(logits /
    temperature), cut to the nucleus and renormalised when top_p < 1. For exact message probabilities."""
    probs = _nucleus(torch.softmax(logits.float() / temperature, dim=-1), top_p)
    return probs / probs.sum(-1, keepdim=True) if top_p < 1.0 else probs


@torch.no_grad()
def sample_completions(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, group_size: int = 1,
                       max_new_tokens: int = 16, temperature: float = 1.0, top_p: float = 1.0,
                       greedy: bool = False, eos_token_id: int | Sequence[int], pad_token_id: int,
                       generator: torch.Generator | None = None,
                       row_keys: Sequence[int] | None = None,
                       adapter_names: Sequence[str] | None = None) -> Completions:
    """Sample `group_size` completions per prompt with a KV cache, stopping rows at EOS.

    Identical prompts are computed once: the G rows of a prompt, and rows whose prompts are the same
    tokens (the G episodes of a task at their first turn), start from one prefill. Every row then
    decodes in one batch, in lockstep, its keys and values written in place into a preallocated cache
    (`trainers.policy.kv_cache`: no per-step copy of the cache); rows that stopped are dropped from the
    batch once half of it has. Greedy decoding runs each distinct prompt once and copies the result
    to its rows. Each row draws its own tokens, so the samples are those of independent generations.
    Rows stop at EOS (`eos_token_id`: one id or several, e.g. a chat model's end of turn and its end of
    text); generation stops when every row has. `greedy=True` takes the argmax (evaluation at
    temperature 0). Pass a seeded `generator`, or `row_keys` (one `stream_key` per prompt; row g of a
    prompt draws from its key and g) for samples that do not depend on which other prompts share the
    batch (`keyed_uniforms`). `adapter_names` (one per prompt; `model` a peft model in eval mode) runs each
    row with its prompt's LoRA adapter, all in one batch: the base's matmuls run once for every adapter
    (peft's mixed-batch forward), and identical prompts share a prefill only under the same adapter.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (use greedy=True for temperature 0)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    device = model_device(model)  # every tensor of the batch lives where the model does (a no-op on the CPU)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    stop_ids = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id),
                            dtype=torch.long, device=device)
    rows_prompt = torch.arange(prompt_ids.size(0), device=device).repeat_interleave(group_size)
    codes = None
    if adapter_names is not None:
        if len(adapter_names) != prompt_ids.size(0):
            raise ValueError(f"adapter_names has {len(adapter_names)} names for {prompt_ids.size(0)} prompts")
        code = {name: index for index, name in enumerate(dict.fromkeys(adapter_names))}
        codes = torch.tensor([code[name] for name in adapter_names], device=device)
    distinct, prompt_of = _distinct_prompts(prompt_ids, prompt_mask, codes)
    source = prompt_of[rows_prompt]  # each row's distinct prompt
    keys = _row_keys(row_keys, prompt_ids.size(0), group_size) if row_keys is not None and not greedy else None
    rows = torch.arange(distinct.numel(), device=device) if greedy else source  # greedy: each distinct prompt once
    adapters = None if adapter_names is None else [adapter_names[i] for i in distinct.tolist()]
    tokens, logprobs, entropy, mask, done = _decode(
        model, prompt_ids[distinct], prompt_mask[distinct], rows, max_new_tokens=max_new_tokens,
        temperature=temperature, top_p=top_p, greedy=greedy, generator=generator, keys=keys, stop_ids=stop_ids,
        pad_token_id=pad_token_id, adapters=adapters)
    if greedy:  # the distinct prompts' completions, copied to their rows
        tokens, logprobs, entropy, mask, done = (t[source] for t in (tokens, logprobs, entropy, mask, done))
    return Completions(prompt_ids=prompt_ids[rows_prompt], prompt_mask=prompt_mask[rows_prompt],
                       completion_ids=tokens, completion_mask=mask.long(), logprobs=logprobs,
                       truncated=~done, entropy=entropy, prompt_index=rows_prompt)


def _distinct_prompts(ids: torch.Tensor, mask: torch.Tensor, codes: torch.Tensor | None = None):
    """(index of one row per distinct prompt, each prompt's distinct index): identical rows computed once
    (under the same adapter, when `codes` gives each row's adapter)."""
    columns = [ids, mask] if codes is None else [ids, mask, codes[:, None]]
    _, inverse = torch.unique(torch.cat(columns, dim=1), dim=0, return_inverse=True)
    order = torch.arange(ids.size(0), device=ids.device)
    first = torch.full((int(inverse.max()) + 1,), ids.size(0), dtype=torch.long, device=ids.device)
    return first.scatter_reduce(0, inverse, order, reduce="amin"), inverse


def _decode(model, prompt_ids, prompt_mask, rows, *, max_new_tokens, temperature, top_p, greedy, generator, keys,
            stop_ids, pad_token_id, adapters=None):
    """Prefill the prompts once, then decode `rows` (row -> its prompt) in lockstep: per row (N, C) tokens,
    logprobs, entropy, mask, and whether it stopped (N,). Batch rows are the live rows (`alive`), dropped
    in one copy when half of them have stopped. `adapters`: each prompt's LoRA adapter name."""
    from trainers.policy.kv_cache import preallocate

    device, n, width = prompt_ids.device, rows.numel(), prompt_ids.size(1)

    def adapter_of(prompts):  # the forward's keyword naming each batch row's adapter (none without adapters)
        return {} if adapters is None else {"adapter_names": [adapters[i] for i in prompts.tolist()]}

    out, cache = _forward_with_cache(model, None, input_ids=prompt_ids, attention_mask=prompt_mask,
                                     position_ids=_positions(prompt_mask), logits_to_keep=1,
                                     **adapter_of(torch.arange(prompt_ids.size(0))))
    logits = out.logits[:, -1][rows]
    if not preallocate(cache, rows, width + max_new_tokens):  # another kind of cache: expanded as it is
        cache.batch_select_indices(rows)
    attention = torch.zeros((n, width + max_new_tokens), dtype=prompt_mask.dtype, device=device)
    attention[:, :width] = prompt_mask[rows]
    position = prompt_mask[rows].sum(-1, keepdim=True)
    alive = torch.arange(n, device=device)  # the row each batch row decodes
    done = torch.zeros(n, dtype=torch.bool, device=device)
    tokens = torch.full((n, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
    logprobs, entropy = torch.zeros((2, n, max_new_tokens), device=device)  # 0 on padding
    mask = torch.zeros((n, max_new_tokens), dtype=torch.bool, device=device)
    for index in range(max_new_tokens):
        batch_running = (~done[alive]).nonzero().squeeze(-1)
        running = alive[batch_running]
        uniforms = keyed_uniforms(keys[running.cpu().numpy()], index) if keys is not None else None
        picked, picked_logprobs, picked_entropy = _pick_tokens(logits[batch_running], temperature, top_p, greedy,
                                                               generator, uniforms)
        tokens[running, index], logprobs[running, index], entropy[running, index] = picked, picked_logprobs, \
            picked_entropy
        mask[running, index] = True
        done[running] = torch.isin(picked, stop_ids)
        if bool(done.all()) or index + 1 == max_new_tokens:
            break
        feed = torch.full((alive.numel(),), pad_token_id, dtype=torch.long, device=device)
        feed[batch_running] = picked  # a stopped row is fed padding until it is dropped; nothing reads it
        live = ~done[alive]
        if 2 * int(live.sum()) <= alive.numel():
            keep = live.nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            alive, feed, attention, position = alive[keep], feed[keep], attention[keep], position[keep]
        attention[:, width + index] = 1
        out, cache = _forward_with_cache(model, cache, input_ids=feed[:, None],
                                         attention_mask=attention[:, :width + index + 1], position_ids=position,
                                         **adapter_of(rows[alive]))
        logits, position = out.logits[:, -1], position + 1
    steps = index + 1
    return tokens[:, :steps], logprobs[:, :steps], entropy[:, :steps], mask[:, :steps], done


def _row_keys(prompt_keys: Sequence[int], prompts: int, group_size: int):
    """Each row's key (numpy uint64): the prompt's key for G = 1, else a key of (prompt key, member)."""
    import numpy as np

    if len(prompt_keys) != prompts:
        raise ValueError(f"row_keys has {len(prompt_keys)} keys for {prompts} prompts (one per prompt)")
    if group_size == 1:
        return np.asarray([int(k) for k in prompt_keys], dtype=np.uint64)
    return np.asarray([stream_key(int(k), member) for k in prompt_keys for member in range(group_size)],
                      dtype=np.uint64)


@dataclass
class _Pack:
    """Token layout of packed sequences (S, L): ids, positions, and for every token its block/row."""

    ids: list[list[int]]
    positions: list[list[int]]
    blocks: list[list[int]]  # which (prompt) block a token belongs to; -1 for padding
    rows: list[list[int]]  # which completion row a token belongs to; -1 for prompt tokens and padding
    targets: list[tuple[int, int, int, int]]  # (row, step, sequence, index of the logits that predict it)


def pack_completions(completions: Completions, pack_tokens: int = 1024, *, share_prompts: bool = True) -> _Pack:
    """Lay rows out as packed sequences: each prompt once, followed by its rows' completions.

    A row's completion attends to its prompt and to its own earlier tokens only (see `_pack_mask`),
    so one forward over the pack gives every row's logprobs with no padding waste and no prompt
    computed twice. A sequence holds at most `pack_tokens` tokens (a prompt whose rows need more is
    repeated in the next sequence), which bounds the (L x L) attention mask.

    `share_prompts=False` is the per-row layout: every row is its own segment, its prompt then its
    completion, positions restarting at 0, so plain causal attention within each segment is exact and
    no mask is needed (transformers finds the segments from the positions: a varlen kernel for flash
    attention, its own packed mask otherwise).
    """
    lengths = completions.completion_mask.sum(-1).clamp(min=1).tolist()
    by_prompt: dict[int, list[int]] = {}
    for row, prompt in enumerate(completions.prompt_index.tolist()):
        by_prompt.setdefault(prompt, []).append(row)
    pack = _Pack([], [], [], [], [])
    block = -1
    for prompt_rows in by_prompt.values():
        first = prompt_rows[0]
        prompt = completions.prompt_ids[first][completions.prompt_mask[first].bool()].tolist()
        block_open = False
        for row in prompt_rows:
            needed = lengths[row] - 1  # the last token is predicted, never fed
            if not (block_open and share_prompts and len(pack.ids[-1]) + needed <= pack_tokens):
                if not pack.ids or len(pack.ids[-1]) + len(prompt) + needed > pack_tokens:
                    for column in (pack.ids, pack.positions, pack.blocks, pack.rows):
                        column.append([])
                block, block_open = block + 1, True
                _append(pack, prompt, range(len(prompt)), block, -1)
                prompt_end = len(pack.ids[-1]) - 1
            sequence, start = len(pack.ids) - 1, len(pack.ids[-1])
            _append(pack, completions.completion_ids[row, :needed].tolist(),
                    range(len(prompt), len(prompt) + needed), block, row)
            pack.targets.append((row, 0, sequence, prompt_end))
            pack.targets.extend((row, step, sequence, start + step - 1) for step in range(1, lengths[row]))
    return pack


def microbatch_rows(completions: Completions, max_tokens: int | None) -> list[list[int]]:
    """Rows grouped into micro-batches of at most `max_tokens` packed tokens each (None: one group).

    A row costs its fed completion tokens, plus its prompt's when it is the first row of that prompt in
    the group (`pack_completions` lays a prompt out once per group); a prompt's rows stay together
    while they fit. A single row longer than the budget is a micro-batch of its own.
    """
    if max_tokens is None:
        return [list(range(completions.completion_ids.size(0)))]
    lengths = completions.completion_mask.sum(-1).clamp(min=1).tolist()
    prompt_lengths = completions.prompt_mask.sum(-1).tolist()
    by_prompt: dict[int, list[int]] = {}
    for row, prompt in enumerate(completions.prompt_index.tolist()):
        by_prompt.setdefault(prompt, []).append(row)
    groups, current, used = [], [], 0
    for prompt_rows in by_prompt.values():
        opened = False  # whether this prompt is already laid out in the current group
        for row in prompt_rows:
            cost = lengths[row] - 1 + (0 if opened else prompt_lengths[row])
            if current and used + cost > max_tokens:
                groups.append(current)
                current, used, cost = [], 0, lengths[row] - 1 + prompt_lengths[row]
            current.append(row)
            used, opened = used + cost, True
    return groups + [current] if current else groups


def _append(pack: _Pack, tokens, positions, block: int, row: int) -> None:
    pack.ids[-1].extend(tokens)
    pack.positions[-1].extend(positions)
    pack.blocks[-1].extend([block] * len(tokens))
    pack.rows[-1].extend([row] * len(tokens))


def _pack_mask(blocks: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive (S, 1, L, L) mask: a token sees earlier tokens of its block's prompt and of its own row."""
    length, device = blocks.size(1), blocks.device
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    same_block = blocks[:, :, None] == blocks[:, None, :]
    visible_key = (rows[:, None, :] == -1) | (rows[:, :, None] == rows[:, None, :])
    allowed = causal & same_block & visible_key & (blocks[:, None, :] >= 0)
    allowed |= torch.eye(length, dtype=torch.bool, device=device)  # padding sees itself: no empty softmax rows
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


@contextmanager
def _head_only_at(model, sequence: torch.Tensor, index: torch.Tensor):
    """Inside the block the model's LM head sees only the hidden states at (sequence, index).

    The packed forward needs logits where a completion token is predicted, not at prompt positions:
    with a 152k vocabulary the full (S, L, V) logits are the largest tensor of the step. A pre-hook
    on the output embedding keeps the model's own forward (any logit scaling or soft-capping after
    the head still applies) and hands the head a (1, K, H) batch of the K distinct positions.
    Yields `gathered(logits) -> (K, V)` logits, one row per distinct position, in `positions` order.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    fired = []

    def gather(module, args):
        fired.append(True)
        return (args[0][sequence, index][None], *args[1:])

    handle = head.register_forward_pre_hook(gather) if head is not None else None
    try:
        yield lambda logits: logits[0] if fired else logits[sequence, index]
    finally:
        if handle is not None:
            handle.remove()


def resolve_packing(model, packing: str = "auto") -> str:
    """The training forward's layout: `auto` is per_row when the model runs flash attention (a varlen
    kernel: segments need no mask at all), else shared_prompt (each prompt computed once)."""
    if packing not in PACKINGS:
        raise ValueError(f"packing {packing!r}: expected one of {', '.join(PACKINGS)}")
    if packing != "auto":
        return packing
    implementation = str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "")
    return "per_row" if "flash" in implementation else "shared_prompt"


PACK_TOKENS_MAX = 1024  # the longest packed sequence
PACK_TOKENS_MIN = 64
PACK_ROWS = 4  # auto pack length (shared_prompt): about this many of the batch's longest rows


def auto_pack_tokens(completions: Completions, shared: bool) -> int:
    """The packed sequence length of `completion_logprobs` when none is given.

    per_row: PACK_TOKENS_MAX (no mask: segments cost nothing across each other). shared_prompt: the
    dense (L x L) block mask makes attention cost grow with L for every token, so short rows are packed
    into short sequences: PACK_ROWS times the longest row (prompt + completion), within
    [PACK_TOKENS_MIN, PACK_TOKENS_MAX]. The forward still runs every sequence in one batch; on relay's
    20-token rows this halves the update's time against a fixed 1024 (bench/grpo_vs_trl.py measures it).
    """
    if not shared:
        return PACK_TOKENS_MAX
    longest = int((completions.prompt_mask.sum(-1) + completions.completion_mask.sum(-1)).max().item())
    return max(PACK_TOKENS_MIN, min(PACK_TOKENS_MAX, PACK_ROWS * longest))


def completion_logprobs(model, completions: Completions, temperature: float = 1.0,
                        pack_tokens: int | None = None, packing: str = "auto") -> torch.Tensor:
    """Per-token logprobs (N, C) of the completions under `model` at logits / temperature, in float32.

    Differentiable; one forward over packed sequences (`pack_completions`), so padding costs nothing;
    the LM head runs only at the positions that predict a completion token (`_head_only_at`), and the
    log-softmax is taken in float32 whatever the weights' dtype (as TRL does). Positions past a row's
    length are 0; callers use the mask. `packing` (`resolve_packing`): shared_prompt runs each prompt
    once under a block mask built here (S x L x L); per_row lays each row out as its own segment and
    passes no mask, so flash attention runs it as variable-length sequences and nothing L x L exists.
    `pack_tokens`: the longest packed sequence (None: `auto_pack_tokens`).
    """
    shared = resolve_packing(model, packing) == "shared_prompt"
    if pack_tokens is None:
        pack_tokens = auto_pack_tokens(completions, shared)
    pack = pack_completions(completions, pack_tokens, share_prompts=shared)
    width = max(len(ids) for ids in pack.ids)
    device = model_device(model)

    def padded(column, fill):
        return torch.tensor([values + [fill] * (width - len(values)) for values in column], device=device)

    # per row: padding gets positions 0, 1, ... so that it is a segment of its own, seen by nothing
    positions_in = padded(pack.positions, 0) if shared else torch.tensor(
        [values + list(range(width - len(values))) for values in pack.positions], device=device)
    mask = _pack_mask(padded(pack.blocks, -1), padded(pack.rows, -1), compute_dtype(model)) if shared else None
    row, step, sequence, index = (torch.tensor(column, device=device) for column in zip(*pack.targets))
    # the G rows of a prompt are all predicted from its last token: one head row serves them all
    positions, inverse = torch.unique(sequence * width + index, return_inverse=True)
    with _head_only_at(model, positions // width, positions % width) as gathered:
        out = model(input_ids=padded(pack.ids, 0), attention_mask=mask, position_ids=positions_in, use_cache=False)
    logits = gathered(out.logits)[inverse].float()
    if temperature != 1.0:  # x / 1 == x exactly: skip one (tokens x vocabulary) copy
        logits = logits / temperature
    token = completions.completion_ids[row, step]
    picked = logits.gather(-1, token[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    result = torch.zeros(completions.completion_ids.shape, dtype=picked.dtype, device=device)
    return result.index_put((row, step), picked)


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


def select_rows(completions: Completions, rows: torch.Tensor) -> Completions:
    """The sub-batch of the given rows (a boolean mask or indices)."""
    def pick(tensor):  # an index on another device than the field (a CPU prompt_index, say) is moved to it
        return None if tensor is None else tensor[rows.to(tensor.device)]

    return Completions(**{f.name: pick(getattr(completions, f.name)) for f in fields(Completions)})


def concat_completions(batches: list[Completions]) -> Completions:
    """Stack batches sampled separately (different prompt and completion widths) into one batch.

    Prompts stay left-padded and completions right-padded; `prompt_index` is offset so that rows of
    different batches never share a prompt.
    """
    if not batches:
        raise ValueError("concat_completions needs at least one batch")
    prompt_width = max(b.prompt_ids.size(1) for b in batches)
    completion_width = max(b.completion_ids.size(1) for b in batches)
    pad_id = int(batches[0].prompt_ids[batches[0].prompt_mask == 0].flatten()[:1].tolist()[0]) \
        if (batches[0].prompt_mask == 0).any() else 0
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in Completions.__dataclass_fields__}
    offset = 0
    for b in batches:
        left = prompt_width - b.prompt_ids.size(1)
        right = completion_width - b.completion_ids.size(1)
        parts["prompt_ids"].append(torch.nn.functional.pad(b.prompt_ids, (left, 0), value=pad_id))
        parts["prompt_mask"].append(torch.nn.functional.pad(b.prompt_mask, (left, 0), value=0))
        completion_pad = _completion_pad_id(b)
        parts["completion_ids"].append(torch.nn.functional.pad(b.completion_ids, (0, right), value=completion_pad))
        for name in ("completion_mask", "logprobs", "entropy"):
            parts[name].append(torch.nn.functional.pad(getattr(b, name), (0, right), value=0))
        parts["truncated"].append(b.truncated)
        parts["prompt_index"].append(b.prompt_index + offset)
        parts["prompt_cut"].append(b.prompt_cut)
        parts["version"].append(b.version)
        offset += int(b.prompt_index.max().item()) + 1 if b.prompt_index.numel() else 0
    optional = {name: parts.pop(name) for name in ("prompt_cut", "version")}  # known for all batches, or none
    joined = {name: torch.cat(tensors) for name, tensors in parts.items()}
    return Completions(**joined, **{name: None if any(t is None for t in tensors) else torch.cat(tensors)
                                    for name, tensors in optional.items()})


def _completion_pad_id(batch: Completions) -> int:
    padding = batch.completion_ids[batch.completion_mask == 0]
    return int(padding[0].item()) if padding.numel() else 0
