"""`marl rm train`: a Bradley-Terry reward model from preference pairs (work in trainers/reward/).

    marl rm train --pairs pairs.jsonl --base MODEL_DIR --out runs/rm
    marl rm train --pairs pairs.jsonl --base MODEL_DIR --out runs/rm --epochs 2 --lora-r 8
    marl rm train --pairs pairs.jsonl --base MODEL_DIR --out runs/rm0 --epochs 0    # the untrained baseline

PAIRS is JSONL, one {"prompt", "chosen", "rejected"} object per line. A seeded share of the pairs is
held out (--eval-fraction) and its pairwise accuracy printed after every epoch; metrics go to a W&B
run inside the output directory (offline unless WANDB_MODE says otherwise; --tracker jsonl or none).
--epochs 0 trains nothing: it saves the base with its seeded random head, the untrained baseline to
probe and report like a trained one.
The directory is written only when training has finished (atomically); use it as a scenario judge
(`backend: reward_model`, `model: runs/rm`) or probe it with `marl judges report --reward-model runs/rm`.
A bad line, a pair whose chosen equals rejected, a base that does not load or an --out in the way is
one line naming the problem and where, exit 2, nothing written.
"""

from __future__ import annotations

from judges.model.reward_model import RewardModelError
from marl.options import TRACKERS
from trainers.cli.common import UsageError, path_value, quiet_libraries, usage_errors
from trainers.policy.gguf import GGUFError, resolve_model_dir
from trainers.reward.pairs import PairsError, read_pairs


def add_parser(commands) -> None:
    """Register `marl rm train`."""
    rm = commands.add_parser("rm", help="train reward models on preference pairs")
    rm.set_defaults(handler=run)
    sub = rm.add_subparsers(dest="rm_command", required=True)
    train = sub.add_parser("train", help="train a Bradley-Terry reward model (a scalar head on a causal LM)")
    train.add_argument("--pairs", required=True, type=path_value,
                       help='JSONL of {"prompt", "chosen", "rejected"} lines')
    train.add_argument("--base", required=True, metavar="MODEL_DIR", type=path_value,
                       help="a Hugging Face causal LM directory, a .gguf file or "
                            "smollm2-135m-instruct (converted once)")
    train.add_argument("--out", required=True, metavar="RM_DIR", type=path_value, help="where the reward model goes")
    train.add_argument("--epochs", type=int, default=1, help="passes over the training pairs (default 1); 0: no "
                                                             "training, the base with its seeded untrained head")
    train.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate, linear decay to 0 (default 1e-4)")
    train.add_argument("--batch-size", type=int, default=8, help="pairs per step (default 8)")
    train.add_argument("--max-length", type=int, help="tokens per rendered answer; longer pairs are left out "
                                                      "(default: min(1024, the base model's context))")
    train.add_argument("--eval-fraction", type=float, default=0.1, help="share of pairs held out (default 0.1)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--lora-r", type=int, default=0, help="train LoRA adapters of this rank (merged on save); "
                                                             "0: the whole model (default)")
    train.add_argument("--center-coefficient", type=float, default=0.0,
                       help="weight of the reward-centring term (TRL's center_rewards_coefficient; default 0)")
    train.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    train.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    train.add_argument("--tracker", choices=TRACKERS, default="wandb", help="wandb (offline by default), jsonl, none")
    train.add_argument("--project", default="marl", help="W&B project")
    train.add_argument("--overwrite", action="store_true", help="replace a non-empty --out when training finishes")


def run(args) -> int:
    """Train and print where the reward model went and its held-out accuracy."""
    from trainers.reward.bradley_terry import RewardTrainConfig, train_reward_model

    quiet_libraries()
    with usage_errors(PairsError):  # a bad --pairs file is its one line before a .gguf --base converts (minutes)
        read_pairs(args.pairs)
    try:  # a .gguf file or a packaged model: its converted directory in the model cache, recorded as the base
        base = str(resolve_model_dir(args.base))
    except GGUFError as error:
        raise UsageError(f"--base {args.base}: {error}") from None
    config = RewardTrainConfig(pairs=args.pairs, base=base, out=args.out, epochs=args.epochs, lr=args.lr,
                               batch_size=args.batch_size, max_length=args.max_length,
                               eval_fraction=args.eval_fraction, seed=args.seed, lora_r=args.lora_r,
                               center_coefficient=args.center_coefficient, threads=args.threads,
                               log_every=args.log_every, tracker=args.tracker, project=args.project,
                               overwrite=args.overwrite)
    with usage_errors(PairsError, RewardModelError, OSError):
        summary = train_reward_model(config)
    held = summary.get("held_out") or {}
    before = summary.get("held_out_before") or {}
    figures = (f"held-out accuracy {before.get('accuracy', float('nan')):.3f} -> {held['accuracy']:.3f} on "
               f"{held['pairs']} pairs" if held else "no held-out pairs")
    if not summary["steps"]:
        before_only = (f"held-out accuracy {before['accuracy']:.3f} on {before['pairs']} pairs" if before
                       else "no held-out pairs")
        print(f"wrote {args.out}: untrained (0 epochs: the base with its seeded head); {before_only}")
        return 0
    print(f"wrote {args.out}: {figures}; {summary['seconds_per_epoch']:.1f} s/epoch")
    return 0
