"""A trained reward model as a judge: one scalar reward per answer, from a sequence-classification model.

    judge = RewardModelJudge.load("runs/rm", name="rm")     # a directory `marl rm train` wrote
    judge.score(Item(prompt), [Candidate(text)])            # score = sigmoid(reward - center), in [0, 1]
    await judge.compare(item, a, b)                         # P(a better) = sigmoid(r_a - r_b)

A reward model trained on preference pairs (Bradley-Terry) gives each (prompt, answer) a real number
whose differences are log-odds of preference. As a scorer it maps a reward to [0, 1] by a sigmoid
around `center` (the mean reward of the answers it was trained on, recorded at training time), and
keeps the raw reward in `details["reward"]`; a calibrator fitted for it (`marl judges calibrate`)
binds to its identity like a prompted judge's. As a pairwise judge (for `marl judges report`), a
pair's verdict follows the sign of the reward difference and its probability is the Bradley-Terry
one; both orders give the same verdict, since the model reads each answer alone.

Failures are never a number: an answer whose rendering is longer than the model's `max_length` tokens
is a `truncated` judgment, a non-finite reward an `error` one. A directory that is not a reward model,
or whose tokenizer files differ from the tokenizer it was trained with, is a `RewardModelError` (one
line) when the judge is built. torch and transformers are imported on first use only.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from common.files import FileProblem, read_json_file
from common.model_files import model_folder_problem, shape_problem
from judges.model.prompted import PairJudgment
from judges.types import Candidate, Item, Judgment, failed

METADATA_FILE = "marl_reward_model.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "tokenizer.model", "chat_template.jinja")
CACHE_SIZE = 4096  # rewards kept per judge: the bias probes score the same original answers many times


class RewardModelError(ValueError):
    """A reward model directory that cannot be used (one line: what is wrong and how to fix it)."""


def render_conversation(tokenizer, prompt: str, answer: str) -> str:
    """The text a reward model reads: the user's prompt and the assistant's answer, rendered with the
    tokenizer's chat template (no generation prompt after it), else the two joined by a newline."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return f"{prompt}\n{answer}"


def tokenizer_fingerprint(directory: str | Path) -> str:
    """sha256 over the tokenizer files a directory holds (names and bytes): which tokenizer it is."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = Path(directory) / name
        if path.is_file():
            digest.update(name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


WEIGHT_SUFFIXES = (".safetensors", ".bin")


def weights_fingerprint(directory: str | Path) -> str:
    """sha256 over a directory's config and weight files (read in blocks): which trained model it is."""
    digest = hashlib.sha256()
    for path in sorted(Path(directory).iterdir()):
        if path.name == "config.json" or path.suffix in WEIGHT_SUFFIXES:
            digest.update(path.name.encode())
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def read_metadata(directory: str | Path) -> dict:
    """The training record `marl rm train` leaves in a reward model directory; RewardModelError when the
    directory is not one (no config.json, no record, or a model with more than one output)."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise RewardModelError(f"{directory}: not a model directory (no config.json); give a directory written "
                               "by `marl rm train --out DIR`")
    # a FIFO or device among its files, pickle-only or truncated weights, no tokenizer: before any is read
    if (problem := model_folder_problem(directory, require_weights=False)) is not None:
        raise RewardModelError(problem)
    path = directory / METADATA_FILE
    if not path.exists():
        raise RewardModelError(f"{directory}: no {METADATA_FILE}, so not a reward model `marl rm train` wrote "
                               "(a causal LM is not a reward model: train one with `marl rm train --base DIR`)")
    try:  # bounded as every user file is: not UTF-8, nested 100,000 deep or a 5,000-digit number is one line
        metadata = read_json_file(path, max_bytes=1 << 20, expected="the record `marl rm train` writes")
    except FileProblem as error:
        raise RewardModelError(f"{error.path}{f':{error.line}' if error.line else ''}: unreadable "
                               f"({error.reason.split('; ')[0]}); retrain the reward model") from None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("tokenizer_sha256"), str):
        raise RewardModelError(f"{path}: not a reward model record (no tokenizer_sha256); retrain the reward model")
    if (wrong := _metadata_problem(metadata)) is not None:
        raise RewardModelError(f"{path}: {wrong}; retrain the reward model")
    if not any(p.suffix == ".safetensors" for p in directory.iterdir()):
        raise RewardModelError(f"{directory}: no weight file (*.safetensors); the directory is incomplete: "
                               "copy it again or retrain the reward model")
    return metadata


def _metadata_problem(metadata: dict) -> str | None:
    """Why the record's numbers cannot be used (a reward center that is not a finite number, a max_length that
    is not a count of tokens), or None: they become every score and the cut of every answer."""
    center, length = metadata.get("reward_center", 0.0), metadata.get("max_length")
    if isinstance(center, bool) or not isinstance(center, int | float) or not math.isfinite(center):
        return f"its reward_center {str(center)[:40]!r} is not a finite number"
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= 1 << 20):
        return f"its max_length {str(length)[:40]!r} is not a count of tokens (1 to 1,048,576)"
    return None


def check_tokenizer(directory: str | Path, metadata: dict) -> None:
    """RewardModelError when the directory's tokenizer is not the one the model was trained with."""
    found = tokenizer_fingerprint(directory)
    if found != metadata["tokenizer_sha256"]:
        raise RewardModelError(f"{directory}: its tokenizer files differ from the tokenizer the reward model was "
                               f"trained with (sha256 {found[:12]} != {metadata['tokenizer_sha256'][:12]}); put "
                               "the training tokenizer back, or retrain on this tokenizer")


def reward_model_problem(directory: str | Path) -> str | None:
    """What is wrong with a reward model directory, in one line, or None when it can be loaded (torch-free:
    reads the training record and the tokenizer files, as scenario validation does before any model loads)."""
    try:
        check_tokenizer(directory, read_metadata(directory))
    except RewardModelError as error:
        return str(error)
    except OSError as error:  # a name too long for the file system, a file that fails to read
        return f"{str(directory)[:200]}: cannot be read ({error.strerror or error}); give a directory written by " \
               "`marl rm train --out DIR`"
    return None


JUDGE_DEVICES = ("cpu", "cuda", "mps", "auto")


def resolve_judge_device(name: str) -> str:
    """Where a reward model runs: `auto` = cuda when torch sees one, else mps, else cpu; a named device must
    exist (RewardModelError, one line, naming judges[].device)."""
    import torch

    if name not in JUDGE_DEVICES:
        raise RewardModelError(f"judges[].device={name!r} is not one of {', '.join(JUDGE_DEVICES)}")
    mps = getattr(torch.backends, "mps", None)
    has = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": bool(mps is not None and mps.is_available())}
    if name == "auto":
        return "cuda" if has["cuda"] else "mps" if has["mps"] else "cpu"
    if not has[name]:
        raise RewardModelError(f"judges[].device={name} but torch sees no such device here; use cpu or auto")
    return name


class RewardModel:
    """A reward model directory, loaded: `rewards(prompts, answers)` -> a float per pair (None: too long)."""

    def __init__(self, directory: str | Path, *, device: str = "cpu", batch_size: int = 16):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.directory = Path(directory).resolve()
        self.metadata = read_metadata(self.directory)
        check_tokenizer(self.directory, self.metadata)
        if (problem := shape_problem(self.directory)) is not None:  # config.json edited: nothing allocated
            raise RewardModelError(problem)
        what = "it does not load"
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.directory)
            what = "its chat template fails to render an answer"  # checked now, not once per answer scored
            render_conversation(self.tokenizer, "1+2=", "3")
            what = "its weights do not load"
            model, info = AutoModelForSequenceClassification.from_pretrained(
                self.directory, dtype=torch.float32, use_safetensors=True, output_loading_info=True)
        except Exception as error:  # noqa: BLE001 - corrupt weights, a failing template raise many kinds
            message = " ".join(str(error).split())[:200]
            raise RewardModelError(f"{self.directory}: {what} ({type(error).__name__}: {message}); "
                                   "copy the directory again or retrain the reward model") from None
        if info.get("missing_keys"):  # transformers would have filled them with random numbers
            raise RewardModelError(f"{self.directory}: config.json does not match the weights (they do not hold "
                                   f"{sorted(info['missing_keys'])[0]}); copy the directory again or retrain")
        self.tokenizer.padding_side = "right"
        if model.config.num_labels != 1:
            raise RewardModelError(f"{self.directory}: the model has {model.config.num_labels} outputs; a reward "
                                   "model has one (num_labels=1)")
        if len(self.tokenizer) > model.config.vocab_size:
            raise RewardModelError(f"{self.directory}: the tokenizer has {len(self.tokenizer)} tokens but the model "
                                   f"only {model.config.vocab_size}: they were not trained together")
        self.model = model.to(device).eval()
        self.device, self.batch_size = device, batch_size
        self.max_length = int(self.metadata.get("max_length") or getattr(model.config, "max_position_embeddings", 512))
        self.lock = threading.Lock()  # one forward at a time: the judge's calls arrive from several threads

    def rewards(self, prompts: Sequence[str], answers: Sequence[str]) -> list[float | None]:
        """The reward of each (prompt, answer); None for one whose rendering exceeds `max_length` tokens."""
        texts = [render_conversation(self.tokenizer, p, a) for p, a in zip(prompts, answers, strict=True)]
        ids = [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
        fits = [i for i, row in enumerate(ids) if 0 < len(row) <= self.max_length]
        out: list[float | None] = [None] * len(texts)
        with self.lock:
            for start in range(0, len(fits), self.batch_size):
                chunk = fits[start:start + self.batch_size]
                for index, value in zip(chunk, self._forward([ids[i] for i in chunk])):
                    out[index] = value
        return out

    def _forward(self, rows: list[list[int]]) -> list[float]:
        import torch

        width = max(len(row) for row in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        input_ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows], device=self.device)
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows], device=self.device)
        with torch.no_grad():
            logits = self.model(input_ids=input_ids, attention_mask=mask).logits
        return [float(v) for v in logits[:, 0].float().tolist()]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


class RewardModelJudge:
    """A reward model as a Scorer (pointwise scores) and as a pairwise judge (`compare`), see the module doc."""

    kind = "reward_model"
    orders = "both"  # a pair counts as judged in both orders (the verdict cannot depend on the order)

    def __init__(self, model: RewardModel, *, name: str | None = None):
        self.model, self.name = model, name or "reward_model"
        self.center = float(model.metadata.get("reward_center", 0.0))
        self._cache: OrderedDict[tuple[str, str], float | None] = OrderedDict()
        self._cache_lock = threading.Lock()
        # the weights (by content) and the score mapping, not the path: a moved directory keeps its calibrators
        self._identity = f"reward_model|sha256:{weights_fingerprint(model.directory)[:16]}|center={self.center:.6g}"

    @classmethod
    def load(cls, directory: str | Path, *, name: str | None = None, device: str = "cpu") -> "RewardModelJudge":
        """The judge over a reward model directory, on `device` (cpu, cuda, mps or auto); RewardModelError
        (one line) when it cannot be used."""
        return cls(RewardModel(directory, device=resolve_judge_device(device)), name=name)

    @property
    def identity(self) -> str:
        """Names the trained weights and the score mapping: calibrators are bound to it."""
        return self._identity

    def raw_rewards(self, prompt: str, texts: Sequence[str]) -> list[float | None]:
        """Rewards of several answers to one prompt (cached; None: too long for the model)."""
        with self._cache_lock:
            found = {t: self._cache[prompt, t] for t in texts if (prompt, t) in self._cache}
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            found.update(zip(missing, self.model.rewards([prompt] * len(missing), missing)))
            with self._cache_lock:
                for text in missing:
                    self._cache[prompt, text] = found[text]
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        return [found[t] for t in texts]

    def _judgment(self, reward: float | None) -> Judgment:
        if reward is None:
            return failed("truncated", f"the answer and prompt are longer than the reward model's max_length "
                                       f"({self.model.max_length} tokens)")
        if not math.isfinite(reward):
            return failed("error", f"the reward model returned {reward!r}, not a finite number")
        return Judgment("ok", _sigmoid(reward - self.center), label=f"{reward:.4g}",
                        details={"reward": reward, "center": self.center, "scoring": "reward_model"})

    def score(self, item: Item, candidates: Sequence[Candidate]) -> list[Judgment]:
        """One judgment per candidate: sigmoid(reward - center), the raw reward in details."""
        return [self._judgment(r) for r in self.raw_rewards(item.prompt, [c.text for c in candidates])]

    async def ascore(self, item: Item, candidates: Sequence[Candidate]) -> list[Judgment]:
        """`score` in a worker thread (the forward pass would block the event loop)."""
        return await asyncio.to_thread(self.score, item, candidates)

    async def compare(self, item: Item, a: Candidate, b: Candidate) -> PairJudgment:
        """a against b: P(a better) = sigmoid(r_a - r_b); the verdict is the same in both orders."""
        ra, rb = await asyncio.to_thread(self.raw_rewards, item.prompt, [a.text, b.text])
        for reward in (ra, rb):
            problem = self._judgment(reward)
            if not problem.ok:
                return PairJudgment(None, (), None, problem.status, problem.rationale)
        p_a = _sigmoid(ra - rb)
        verdict = "a" if ra > rb else "b" if rb > ra else "tie"
        return PairJudgment(p_a, (verdict, verdict), True, "ok", rationale=f"rewards {ra:.4g} vs {rb:.4g}",
                            slot1_probabilities=(p_a, 1.0 - p_a))
