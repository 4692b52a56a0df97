"""Bradley-Terry reward models: the loss, the pairs file, training that learns a preference, and the
trained model as a judge (pointwise scores, pairwise verdicts, the bias report's length slope)."""

from __future__ import annotations

import json
import math
import random
import shutil

import pytest
import torch

from judges.model.reward_model import RewardModelError, RewardModelJudge
from judges.types import Candidate, Item
from trainers.reward.bradley_terry import RewardTrainConfig, bradley_terry_loss, pairwise_accuracy, train_reward_model
from trainers.reward.pairs import PairsError, read_pairs, split_pairs

# neutral sentences the length-loving pairs append (not the bias probes' own filler: the report must
# find the preference on text the model was not trained on)
EXTRA = ("The answer follows from the question.", "Each step is checked twice.", "This is stated plainly here.",
         "More detail is given for clarity.", "The result holds in general.", "Note the units used above.",
         "We keep the reasoning short.", "Other views exist as well.")


def length_pairs(count: int, seed: int, longer_wins: bool = True) -> list[dict]:
    """Arithmetic prompts whose preferred answer is the longer one (or the shorter, longer_wins=False):
    both answers are equally correct, so all the model can learn is a length (verbosity) preference."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        short = f"ANSWER: {a + b}."
        long = short + " " + " ".join(rng.sample(EXTRA, rng.randint(1, 4)))
        chosen, rejected = (long, short) if longer_wins else (short, long)
        rows.append({"prompt": f"Task: {a}+{b}=", "chosen": chosen, "rejected": rejected})
    return rows


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def train(tmp_path, base, rows, name="rm", **settings) -> tuple[str, dict]:
    out = tmp_path / name
    config = RewardTrainConfig(pairs=write_jsonl(tmp_path / f"{name}.jsonl", rows), base=str(base), out=str(out),
                               tracker="none", **{"epochs": 2, "lr": 1e-3, **settings})
    return str(out), train_reward_model(config, log=lambda line: None)


# make test (--dist loadgroup): this module's tests run on one worker, so length_rm is built once
pytestmark = pytest.mark.xdist_group("bradley_terry")


@pytest.fixture(scope="module")
def length_rm(tmp_path_factory, real_model_dirs):
    """A reward model trained on 400 pairs whose chosen answer is the longer one (qwen2 base)."""
    return train(tmp_path_factory.mktemp("length_rm"), real_model_dirs["qwen2"], length_pairs(400, seed=0))


def test_loss_is_the_closed_form():
    chosen, rejected = torch.tensor([2.0, -1.0, 0.3]), torch.tensor([0.5, 1.0, 0.3])
    expected = -sum(math.log(1 / (1 + math.exp(-(c - r)))) for c, r in zip(chosen.tolist(), rejected.tolist())) / 3
    assert float(bradley_terry_loss(chosen, rejected)) == pytest.approx(expected, rel=1e-6)
    centred = expected + 0.01 * sum((c + r) ** 2 for c, r in zip(chosen.tolist(), rejected.tolist())) / 3
    assert float(bradley_terry_loss(chosen, rejected, 0.01)) == pytest.approx(centred, rel=1e-6)
    assert pairwise_accuracy(chosen, rejected) == pytest.approx((1 + 0 + 0.5) / 3)


@pytest.mark.parametrize("lines, message", [
    (['{"prompt": "p", "chosen": "a", "rejected": "b"}', "{not json"], ":2: not valid JSON"),
    (['{"prompt": "p", "chosen": "a"}'], ":1: missing 'rejected'"),
    (['{"prompt": "p", "chosen": "a", "rejected": 3}'], ":1: 'rejected' must be a string, got int"),
    (['', '{"prompt": "p", "chosen": "same", "rejected": "same"}'], ":2: 'chosen' equals 'rejected'"),
    (['["p", "a", "b"]'], ":1: expected a JSON object"),
    (['', '   '], ": no pairs"),
])
def test_a_bad_pairs_file_names_the_line(tmp_path, lines, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PairsError) as error:
        read_pairs(path)
    assert str(error.value).startswith(str(path)) and message in str(error.value)
    assert "\n" not in str(error.value)


def test_the_held_out_split_is_seeded_and_disjoint(tmp_path):
    pairs = read_pairs(write_jsonl(tmp_path / "p.jsonl", length_pairs(50, seed=1)))
    train_a, held_a = split_pairs(pairs, 0.2, seed=3)
    train_b, held_b = split_pairs(pairs, 0.2, seed=3)
    assert (train_a, held_a) == (train_b, held_b) and len(held_a) == 10
    assert {p.line for p in train_a}.isdisjoint({p.line for p in held_a})
    assert split_pairs(pairs, 0.2, seed=4)[1] != held_a


def test_training_learns_the_preference_it_is_shown(length_rm):
    directory, summary = length_rm
    assert summary["held_out_pairs"] == 40 and summary["train_pairs"] == 360
    assert summary["held_out"]["accuracy"] >= 0.9 > summary["held_out_before"]["accuracy"]
    judge = RewardModelJudge.load(directory)
    item = Item(prompt="Task: 7+8=")  # a prompt it was not trained on
    short, padded = judge.score(item, [Candidate("ANSWER: 15."), Candidate("ANSWER: 15. It is worth noting.")])
    assert short.ok and padded.ok and 0 <= short.score < padded.score <= 1
    assert padded.details["reward"] > short.details["reward"]


def test_the_bias_report_flags_a_length_loving_reward_model(length_rm, tmp_path, real_model_dirs):
    from judges.stats.bias_report import ReportItem, run_bias_report

    items = [ReportItem(id=str(i), prompt=f"Task: {i}+{i}=", candidates=(f"ANSWER: {2 * i}.", f"ANSWER: {2 * i + 1}."))
             for i in range(1, 41)]
    report = run_bias_report(RewardModelJudge.load(length_rm[0]), items, per_kind=40, seed=0)
    assert report["verdicts"]["length.slope"] == "fail", report["length"]
    assert report["length"]["slope"]["ci_low"] > 0.5
    # the control: the same training where the shorter answer wins measures the opposite slope
    short_rm, _ = train(tmp_path, real_model_dirs["qwen2"], length_pairs(400, seed=0, longer_wins=False), name="short")
    control = run_bias_report(RewardModelJudge.load(short_rm), items, per_kind=40, seed=0)
    assert control["length"]["slope"]["ci_high"] < 0


def test_pairwise_verdicts_come_from_reward_differences(length_rm):
    from judges.model.backend import run_sync

    judge = RewardModelJudge.load(length_rm[0])
    item, a, b = Item(prompt="Task: 3+4="), Candidate("ANSWER: 7. More detail is given."), Candidate("ANSWER: 7.")
    pair = run_sync(judge.compare(item, a, b))
    ra, rb = (j.details["reward"] for j in judge.score(item, [a, b]))
    assert pair.p_a == pytest.approx(1 / (1 + math.exp(-(ra - rb))))
    assert pair.verdicts == ("a", "a") and pair.consistent


def test_an_answer_past_the_context_is_a_failed_judgment_not_a_number(length_rm):
    judge = RewardModelJudge.load(length_rm[0])
    long, short = judge.score(Item(prompt="Task: 1+1="), [Candidate("word " * 2000), Candidate("ANSWER: 2.")])
    assert long.status == "truncated" and long.score is None and "max_length" in long.rationale
    assert short.ok


def test_a_directory_that_is_not_a_reward_model_is_one_clear_error(length_rm, real_model_dirs, tmp_path):
    with pytest.raises(RewardModelError, match="not a reward model"):
        RewardModelJudge.load(real_model_dirs["qwen2"])  # a causal LM: no training record
    moved = tmp_path / "other_tokenizer"
    shutil.copytree(length_rm[0], moved)
    from trainers.policy.tokenizer import build_bpe_tokenizer

    build_bpe_tokenizer(["a different corpus entirely", "with other merges"], 300).save_pretrained(moved)
    with pytest.raises(RewardModelError, match="differ from the tokenizer the reward model was trained with"):
        RewardModelJudge.load(moved)


def test_lora_training_saves_a_plain_reward_model(tmp_path, real_model_dirs):
    directory, summary = train(tmp_path, real_model_dirs["llama"], length_pairs(200, seed=2), name="lora", lora_r=4)
    assert not (tmp_path / "lora" / "adapter_config.json").exists()  # merged: loads without peft
    assert summary["held_out"]["accuracy"] > summary["held_out_before"]["accuracy"]
    judge = RewardModelJudge.load(directory)
    short, padded = judge.score(Item(prompt="Task: 2+2="), [Candidate("ANSWER: 4."),
                                                            Candidate("ANSWER: 4. Each step is checked twice.")])
    assert padded.details["reward"] > short.details["reward"]


def test_only_newlines_end_a_pair(tmp_path):
    """A JSON string may hold U+2028 or a form feed (str.splitlines would break the line there)."""
    rows = [{"prompt": "p\u2028q", "chosen": "a\x0cb", "rejected": "c\u2029"}, {"prompt": "p", "chosen": "x", "rejected": "y"}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\r\n" for row in rows) + "{bad\n", encoding="utf-8")
    with pytest.raises(PairsError, match=r"pairs.jsonl:3: not valid JSON"):
        read_pairs(path)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    assert [pair.prompt for pair in read_pairs(path)] == ["p\u2028q", "p"]


@pytest.mark.parametrize("settings, message", [
    ({"center_coefficient": -1.0}, "--center-coefficient -1.0: expected a number >= 0"),
    ({"center_coefficient": float("nan")}, "--center-coefficient nan"),
    ({"lr": 1e30}, "training diverged at step"),
])
def test_bad_settings_and_divergence_are_one_line_and_write_nothing(tmp_path, real_model_dirs, settings, message):
    with pytest.raises(PairsError, match=message):
        train(tmp_path, real_model_dirs["qwen2"], length_pairs(40, seed=3), **{"epochs": 3, **settings})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rm.jsonl"]


def test_a_reward_model_whose_weights_are_gone_or_broken_is_one_clear_error(length_rm, tmp_path):
    from judges.model.reward_model import reward_model_problem

    broken = tmp_path / "broken"
    shutil.copytree(length_rm[0], broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(RewardModelError, match="model.safetensors .*: not a safetensors file"):
        RewardModelJudge.load(broken)
    (broken / "model.safetensors").unlink()
    assert "no weight file" in reward_model_problem(broken)


def test_zero_epochs_saves_the_untrained_baseline_reproducibly(tmp_path, real_model_dirs):
    """`--epochs 0`: no step, the base with its seeded head, a judge like any other (the report's baseline)."""
    rows = length_pairs(40, seed=4)
    first, summary = train(tmp_path, real_model_dirs["qwen2"], rows, name="zero", epochs=0, eval_fraction=0.25)
    assert summary["steps"] == 0 and summary["epochs"] == [] and summary["seconds_per_epoch"] is None
    assert summary["held_out"]["accuracy"] == summary["held_out_before"]["accuracy"]
    second, _ = train(tmp_path, real_model_dirs["qwen2"], rows, name="again", epochs=0, eval_fraction=0.25)
    item, answers = Item(prompt="Task: 2+2="), [Candidate("ANSWER: 4."), Candidate("ANSWER: 5. Checked.")]
    rewards = [[j.details["reward"] for j in RewardModelJudge.load(d).score(item, answers)] for d in (first, second)]
    assert rewards[0] == rewards[1]  # the same seed, the same untrained head


@pytest.mark.parametrize("text, message", [
    ('{"prompt": "p", "chosen": "a", "rejected": "b", "n": ' + "9" * 5000 + "}\n", ":1: an integer of 5,000 digits"),
    ("[" * 100_000 + "]" * 100_000 + "\n", ":1: JSON nested more than 100 levels deep"),
    ('{"prompt": "p", "chosen": "a", "rejected": "b", "w": Infinity}\n', ":1: Infinity is not a JSON number"),
])
def test_a_hostile_pairs_line_names_the_line(tmp_path, text, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text(text)
    with pytest.raises(PairsError) as caught:
        read_pairs(path)
    assert str(caught.value).startswith(str(path) + message) and "\n" not in str(caught.value)


def test_a_pairs_file_that_is_not_utf8_text_or_not_a_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_bytes('{"prompt": "p", "chosen": "a", "rejected": "b"}\n'.encode() + b'{"prompt": "\xff"}\n')
    with pytest.raises(PairsError, match=r"pairs\.jsonl:2: not UTF-8 text \(byte 0xff at column 13;"):
        read_pairs(path)
    path.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n'.encode("utf-16").decode("latin-1"),
                    encoding="latin-1")
    with pytest.raises(PairsError, match=r"pairs\.jsonl: is UTF-16 text; save it as UTF-8$"):
        read_pairs(path)
    with pytest.raises(PairsError, match=r"^/dev/zero: is a character device, not a regular file"):
        read_pairs("/dev/zero")
    with pytest.raises(PairsError, match=r": is a folder, not a regular file; give a JSON-lines file \(a JSON object "
                                         r"with prompt, chosen, rejected per line\)$"):
        read_pairs(tmp_path)
