"""marl's Bradley-Terry reward-model training against TRL's RewardTrainer, on the same pairs and base.

Run from a checkout: `python bench/reward_model.py` (2000 pairs, 3 epochs, seeds 0, 1 and 2), or `--quick`
(200 pairs, one epoch, one seed, for tests/integration/test_benchmarks.py).

Data: preference pairs a reward model has to read the prompt to get right. Each prompt asks about an
entity ("Tell me about Lisbon."); the chosen answer is about that entity, the rejected one is the same
sentence about another entity (2/3 of the pairs) or a refusal (1/3). 10% are held out (seeded).
Base: the benches' randomly initialised Qwen2 "tiny" model (hidden 64, 2 layers, the project's BPE
tokenizer and ChatML template; bench/support/real_model.py). Both trainers get the very same token
ids (TRL receives the pre-tokenised `chosen_ids` / `rejected_ids` marl's rendering produced, so it
adds nothing), the same seed, lr 1e-4, batch 8 pairs, AdamW with linear decay, float32 on the CPU,
no gradient checkpointing (TRL's defaults of bf16 and gradient checkpointing are turned off: marl
trains in float32 here and checkpointing would only add recomputation at this size), dropout off.
Held-out accuracy (ties count half) is measured by the same function for both models. TRL's
filter of pairs above max_length (1024) removes none here: marl's encoding kept only those that fit.

The last line, `ratio: ...`, is marl's seconds per epoch over TRL's (the anchor, measured in this run).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

ENTITIES = ("Lisbon", "Oslo", "Cairo", "Lima", "Hanoi", "Quito", "Dakar", "Perth", "Kyoto", "Turin", "Bergen",
            "Porto", "Accra", "Davos", "Malta", "Cuba", "Peru", "Chad", "Fiji", "Iran", "Laos", "Mali", "Oman",
            "Togo", "apple", "mango", "lemon", "grape", "melon", "peach", "onion", "carrot", "basil", "cocoa")
FACTS = ("is worth a visit in spring", "has a long history", "is often described in guide books",
         "is known for its colour", "appears in many recipes", "is discussed in school lessons")
REFUSALS = ("I cannot help with that.", "I do not know.", "Please ask something else.")


def preference_pairs(count: int, seed: int) -> list[dict]:
    """`count` pairs whose chosen answer is about the prompt's entity (see the module doc)."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        subject, other = rng.sample(ENTITIES, 2)
        fact = rng.choice(FACTS)
        rejected = rng.choice(REFUSALS) if index % 3 == 0 else f"{other} {fact}."
        rows.append({"prompt": f"Tell me about {subject}.", "chosen": f"{subject} {fact}.", "rejected": rejected})
    return rows


def train_marl(pairs_file: Path, base: Path, out: Path, args, seed: int) -> dict:
    """marl's trainer (trainers/reward/bradley_terry.py): held-out accuracy and seconds per epoch."""
    from trainers.reward.bradley_terry import RewardTrainConfig, train_reward_model

    config = RewardTrainConfig(pairs=str(pairs_file), base=str(base), out=str(out), epochs=args.epochs, lr=args.lr,
                               batch_size=args.batch_size, eval_fraction=0.1, seed=seed, tracker="none",
                               log_every=10 ** 9, overwrite=True)
    summary = train_reward_model(config, log=lambda line: None)
    return {"accuracy": summary["held_out"]["accuracy"], "before": summary["held_out_before"]["accuracy"],
            "seconds_per_epoch": summary["seconds_per_epoch"], "train_pairs": summary["train_pairs"]}


def encoded_split(pairs_file: Path, base: Path, seed: int):
    """(train, held-out) encoded pairs exactly as marl's trainer makes them, and the tokenizer."""
    from transformers import AutoTokenizer

    from trainers.reward.bradley_terry import encode_pairs
    from trainers.reward.pairs import read_pairs, split_pairs

    tokenizer = AutoTokenizer.from_pretrained(base)
    train, held_out = split_pairs(read_pairs(pairs_file), 0.1, seed)
    return encode_pairs(tokenizer, train, 1024)[0], encode_pairs(tokenizer, held_out, 1024)[0], tokenizer


def train_trl(pairs_file: Path, base: Path, out: Path, args, seed: int) -> dict:
    """TRL's RewardTrainer on the same token ids: held-out accuracy (marl's evaluation) and s/epoch."""
    import torch
    from datasets import Dataset, disable_progress_bar
    from transformers import PrinterCallback
    from trl import RewardConfig, RewardTrainer

    from trainers.reward.bradley_terry import evaluate_pairs

    disable_progress_bar()
    train, held_out, tokenizer = encoded_split(pairs_file, base, seed)
    dataset = Dataset.from_list([{"chosen_ids": c, "rejected_ids": r} for c, r in train])
    config = RewardConfig(output_dir=str(out), learning_rate=args.lr, per_device_train_batch_size=args.batch_size,
                          num_train_epochs=args.epochs, seed=seed, report_to=[], save_strategy="no",
                          eval_strategy="no", logging_steps=10 ** 6, bf16=False, gradient_checkpointing=False,
                          use_cpu=True, disable_tqdm=True, max_length=1024, dataloader_num_workers=0,
                          model_init_kwargs={"dtype": torch.float32})
    trainer = RewardTrainer(model=str(base), args=config, train_dataset=dataset, processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)  # its end-of-training dict would interleave with the table
    before = evaluate_pairs(trainer.model, held_out, tokenizer.pad_token_id, args.batch_size)["accuracy"]
    started = time.perf_counter()
    trainer.train()
    seconds = (time.perf_counter() - started) / args.epochs
    accuracy = evaluate_pairs(trainer.model, held_out, tokenizer.pad_token_id, args.batch_size)["accuracy"]
    return {"accuracy": accuracy, "before": before, "seconds_per_epoch": seconds, "train_pairs": len(train)}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 pairs, one seed (the test suite's mode)")
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs, args.seeds, args.epochs = 200, "0", 1
    args.seed_list = [int(s) for s in args.seeds.split(",")]
    return args


def main(argv=None) -> int:
    import importlib.util

    args = parse_args(argv)
    from support.real_model import build_model_dir
    from support.runtime import one_quiet_thread

    one_quiet_thread()
    cache = Path(os.environ.get("MARL_CACHE", Path.home() / ".cache" / "marl")) / "bench"
    base = build_model_dir("tiny", cache / "qwen2-tiny")
    print(f"reward model training: {args.pairs} pairs (10% held out), {args.epochs} epoch(s), lr {args.lr}, "
          f"batch {args.batch_size} pairs, base {base.name}, seeds {args.seed_list}")
    trl_installed = importlib.util.find_spec("trl") is not None
    results = {"marl": [], "trl": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seed_list:
            pairs_file = Path(tmp) / f"pairs-{seed}.jsonl"
            pairs_file.write_text("".join(json.dumps(row) + "\n" for row in preference_pairs(args.pairs, seed)))
            results["marl"].append(train_marl(pairs_file, base, Path(tmp) / f"marl-{seed}", args, seed))
            if trl_installed:
                results["trl"].append(train_trl(pairs_file, base, Path(tmp) / f"trl-{seed}", args, seed))
    print(f"{'trainer':<8}{'seed':>6}{'acc before':>12}{'acc after':>11}{'s/epoch':>10}")
    for name, rows in results.items():
        for seed, row in zip(args.seed_list, rows):
            print(f"{name:<8}{seed:>6}{row['before']:>12.3f}{row['accuracy']:>11.3f}{row['seconds_per_epoch']:>10.2f}")
    if not trl_installed:
        print("ratio: skipped (trl is not installed: pip install -e '.[dev]'; anchor: TRL's RewardTrainer)")
        return 0
    mean = {name: {key: statistics.fmean(r[key] for r in rows) for key in ("accuracy", "seconds_per_epoch")}
            for name, rows in results.items()}
    print(f"mean held-out accuracy: marl {mean['marl']['accuracy']:.3f}, TRL {mean['trl']['accuracy']:.3f}; "
          f"mean s/epoch: marl {mean['marl']['seconds_per_epoch']:.2f}, TRL {mean['trl']['seconds_per_epoch']:.2f}")
    ratio = mean["marl"]["seconds_per_epoch"] / mean["trl"]["seconds_per_epoch"]
    print(f"ratio: {ratio:.2f} (marl seconds per epoch over TRL's; anchor: TRL RewardTrainer, same pairs, base, "
          "token ids and settings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
