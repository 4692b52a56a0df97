"""A model directory written back as a GGUF file (llama.cpp's format), for llama.cpp and Ollama users.

    export_problem("runs/x/model")                    what keeps it from being written, in one line; None when it can be
    write_gguf("runs/x/model", "x.gguf", "f16", log)  the file, written atomically (a temporary sibling, then a rename)

The reverse of trainers/policy/gguf.py's conversion, for what transformers reads back: the Llama and
Qwen2 architectures (SmolLM2 is a Llama; marl's embedded tiny model a Qwen2). The tensors get llama.cpp's
names (the `gguf` package's own name map, the one transformers inverts when it reads a file), and a
Llama's q and k projections get the row permutation llama.cpp's convert_hf_to_gguf.py applies (its
rotary embedding pairs neighbouring rows, transformers' the two halves of a head); transformers undoes
it on reading. Matrices are F32 or F16; norms and biases stay F32, as llama.cpp keeps them. A tied
output layer is left out (a reader ties it back when `output.weight` is absent).

The tokenizer must be byte-level BPE (`tokenizer.ggml.model` gpt2): its tokens by id, padded with
`[PAD<i>]` to the embedding's rows, its merges, token types (special tokens are control, other added
tokens user-defined), bos/eos/pad ids, whether it adds bos, the chat template, and the pre-tokenizer
named as llama.cpp knows it (qwen2, llama-bpe, smollm, gpt-2). A text normalizer (NFC) is not carried:
neither llama.cpp nor transformers applies one to a GGUF byte-level vocabulary.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from common.model_files import model_folder_problem

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
DTYPES = ("f32", "f16")
# the pre-tokenizing split of each llama.cpp name, as tokenizers serialises it (trainers/policy/tokenizer.py's is
# Qwen2's; transformers rebuilds SmolLM2's GGUF with GPT-2's byte-level regex)
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
WITHOUT_EXPORT = "export it as a Hugging Face directory instead (marl export without --gguf)"
UNUSED, NORMAL, CONTROL, USER_DEFINED = 5, 1, 3, 4  # llama.cpp's token types


class GGUFExportError(ValueError):
    """A model that cannot be written as GGUF (the message is one line: what and what to do)."""


def _read_json(path: Path) -> dict | None:
    """The JSON object in `path`, or None when it is missing or not JSON."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested thousands deep
        return None
    return data if isinstance(data, dict) else None


def pre_tokenizer_name(pre: dict | None) -> str | None:
    """llama.cpp's name of a tokenizer.json pre-tokenizer (a byte-level split it knows), else None."""
    if not isinstance(pre, dict):
        return None
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps]
    if kinds == ["ByteLevel"]:
        return "gpt-2" if steps[0].get("use_regex", True) else None
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True) \
            and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert"):
        regex = (steps[0].get("pattern") or {}).get("Regex")
        return {_QWEN2: "qwen2", _LLAMA3: "llama-bpe"}.get(regex)
    return None


def _config_problem(config: dict) -> str | None:
    """What in config.json a GGUF reader would not rebuild (a feature llama.cpp's keys do not carry)."""
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    features = {"rope scaling": rope_type not in (None, "default"), "attention biases (attention_bias)":
                config.get("attention_bias") and config.get("model_type") == "llama",
                "MLP biases (mlp_bias)": config.get("mlp_bias"), "sliding-window attention":
                config.get("use_sliding_window"), f"activation {config.get('hidden_act')!r}":
                config.get("hidden_act", "silu") != "silu"}
    found = [name for name, present in features.items() if present]
    return f"its {', '.join(found)} cannot be written in GGUF's llama keys" if found else None


def _tokenizer_problem(directory: Path) -> str | None:
    """What keeps the directory's tokenizer from GGUF's byte-level BPE, in words."""
    state = _read_json(directory / "tokenizer.json")
    if state is None:
        return "it has no tokenizer.json (a fast tokenizer, as save_pretrained writes it)"
    model = state.get("model") or {}
    if model.get("type") != "BPE" or (state.get("decoder") or {}).get("type") != "ByteLevel":
        return f"its tokenizer is {model.get('type') or 'of an unknown kind'}, not byte-level BPE"
    if pre_tokenizer_name(state.get("pre_tokenizer")) is None:
        return ("its tokenizer's pre-tokenizer is none llama.cpp names (Qwen2's, Llama 3's, SmolLM's or GPT-2's "
                "byte-level split)")
    return None


def export_problem(directory: str | Path) -> str | None:
    """Why the model directory cannot be written as GGUF, in one line naming what to do; None when it can.

    Reads config.json, tokenizer.json and the weights' headers only, so it answers before anything is loaded."""
    directory = Path(directory)
    # a FIFO or device among the files (a read would never end), pickle-only or truncated weights: first
    if (directory / "config.json").exists() and (problem := model_folder_problem(directory)) is not None:
        return problem
    config = _read_json(directory / "config.json")
    if config is None:
        return f"{directory}: no readable config.json; pass a model directory written by save_pretrained"
    architecture = (config.get("architectures") or ["an unknown architecture"])[0]
    if architecture not in ARCHITECTURES:
        return (f"{directory}: {architecture} cannot be written as GGUF (marl writes "
                f"{', '.join(ARCHITECTURES)}); {WITHOUT_EXPORT}")
    problem = _config_problem(config) or _tokenizer_problem(directory)
    return f"{directory}: {problem}; {WITHOUT_EXPORT}" if problem else None


def llama_cpp_permute(weights, heads: int):
    """A q or k projection's rows in llama.cpp's order (each head's two rotary halves interleaved),
    as convert_hf_to_gguf.py's LlamaModel.permute writes them; transformers reverses it on reading."""
    rows = weights.shape[0]
    return weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def _tensors(model, arch: str, dtype: str):
    """(GGUF name, numpy array) of every weight the file holds, in the state dict's order."""
    import gguf
    import numpy as np

    config, state = model.config, model.state_dict()
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch),
                                     config.num_hidden_layers)
    tied = getattr(config, "tie_word_embeddings", False)
    for key, tensor in state.items():
        if key == "lm_head.weight" and tied:
            continue  # the reader ties it back to token_embd when output.weight is absent
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise GGUFExportError(f"the tensor {key} has no GGUF name; {WITHOUT_EXPORT}")
        values = tensor.detach().float().cpu().numpy()
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config.num_attention_heads if "attn_q" in name else config.num_key_value_heads
            values = llama_cpp_permute(values, heads)
        # llama.cpp keeps norms and biases (1-D) in F32 whatever the file type
        yield name, values.astype(np.float16 if dtype == "f16" and values.ndim > 1 else np.float32)


def _hyperparameters(writer, config, arch: str, name: str, dtype: str) -> None:
    """The model's keys: sizes, rotary base, norm epsilon, context, file type."""
    import gguf

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = getattr(config, "rope_parameters", None) or {}
    writer.add_name(name)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(rope.get("rope_theta") or getattr(config, "rope_theta", 10000.0)))
    if arch == "llama":
        writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)


def _tokenizer_keys(writer, tokenizer, rows: int, log: Callable[[str], None]) -> None:
    """The byte-level BPE tokenizer: tokens (padded to the embedding's rows), types, merges, ids, template."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    by_id = {index: token for token, index in state["model"]["vocab"].items()}
    types = dict.fromkeys(by_id, NORMAL)
    for added in state["added_tokens"]:
        by_id[added["id"]] = added["content"]
        types[added["id"]] = CONTROL if added["special"] else USER_DEFINED
    if max(by_id) >= rows:
        raise GGUFExportError(f"the tokenizer has {max(by_id) + 1} tokens but the model's embedding only {rows} rows; "
                              "save the tokenizer the model was trained with")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer_name(state["pre_tokenizer"]))
    writer.add_token_list([by_id.get(i, f"[PAD{i}]") for i in range(rows)])
    writer.add_token_types([types.get(i, UNUSED) for i in range(rows)])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]])
    for add, value in ((writer.add_bos_token_id, tokenizer.bos_token_id), (writer.add_eos_token_id, tokenizer.eos_token_id),
                       (writer.add_pad_token_id, tokenizer.pad_token_id), (writer.add_unk_token_id, tokenizer.unk_token_id)):
        if value is not None:
            add(value)
    ids = tokenizer("a")["input_ids"]
    writer.add_add_bos_token(tokenizer.bos_token_id is not None and ids[:1] == [tokenizer.bos_token_id])
    writer.add_add_eos_token(tokenizer.eos_token_id is not None and ids[-1:] == [tokenizer.eos_token_id])
    if isinstance(tokenizer.chat_template, str) and tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)
    else:
        log("gguf: warning: the tokenizer has no chat template, so the file has none: llama.cpp and Ollama will "
            "render chat with their default; add one to tokenizer_config.json to choose it")


def write_gguf(directory: str | Path, path: str | Path, dtype: str = "f32", log: Callable[[str], None] = print) -> Path:
    """Write the model directory `directory` (a full model: merge an adapter first) as the GGUF file `path`;
    GGUFExportError (one line) for a model it cannot write, checked before the weights are loaded. `log`
    gets the warning lines (a tokenizer without a chat template)."""
    from transformers import AutoTokenizer

    from trainers.policy.loading import check_model_folder, load_model

    directory, path = Path(directory), Path(path)
    if dtype not in DTYPES:
        raise GGUFExportError(f"GGUF tensor type {dtype!r}: choose one of {', '.join(DTYPES)}")
    if (problem := export_problem(directory)) is not None:
        raise GGUFExportError(problem)
    check_model_folder(directory)  # pickle-only or truncated weights, a config that does not fit them: one line
    model = load_model(directory, "float32").eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    arch = ARCHITECTURES[type(model).__name__]
    tensors = list(_tensors(model, arch, dtype))  # every name checked before a byte is written
    _write_atomically(path, lambda tmp: _write(tmp, path.stem, model, tokenizer, arch, tensors, dtype, log))
    return path


def _write(tmp: Path, name: str, model, tokenizer, arch: str, tensors: list, dtype: str, log) -> None:
    """The GGUF file at `tmp`: header, keys, tensors."""
    import gguf

    writer = gguf.GGUFWriter(str(tmp), arch)
    _hyperparameters(writer, model.config, arch, name, dtype)
    _tokenizer_keys(writer, tokenizer, model.get_input_embeddings().weight.shape[0], log)
    for name, values in tensors:
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """`write` a temporary sibling of `path`, then rename it over `path`: a failure leaves `path` as it was."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".gguf.tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
