"""`marl export PATH --out DIR [--merge]`: a checkpoint's models as directories to keep, share or serve.

    marl export runs/relay --out exported                 the newest checkpoint's model directories, as saved
    marl export runs/relay --out exported --merge         LoRA adapters merged into their base: standalone models
    marl export runs/relay/checkpoints/step-000200/model --out merged --merge    one directory

PATH is a run directory (its newest complete checkpoint), a checkpoints/step-N directory, or one model
or adapter directory. A checkpoint with one model writes it to DIR; with several (model/, model-<agent>/)
each goes to DIR/<its name>. Without --merge a LoRA adapter is copied as it is (it still needs its base:
adapter_config.json and marl_base.json name it); with --merge it is merged into its base (the one it
names, or --base) and written as a standalone Hugging Face directory that plain transformers loads.
A full model (a run without train.lora) is copied either way.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from trainers.cli.common import UsageError, quiet_libraries, training_errors, usage_errors


def add_parser(commands) -> None:
    """Register `marl export PATH --out DIR`."""
    export = commands.add_parser("export", help="write a checkpoint's models to a directory (--merge: LoRA adapters "
                                                "merged into their base, standalone)")
    export.add_argument("path", metavar="PATH", help="a run directory, a checkpoints/step-N directory, or one model "
                                                     "or adapter directory")
    export.add_argument("--out", required=True, metavar="DIR", help="where the model directories go")
    export.add_argument("--merge", action="store_true", help="merge LoRA adapters into their base: standalone models")
    export.add_argument("--base", metavar="DIR", help="the adapters' base model directory (default: the one each "
                                                      "adapter names)")
    export.set_defaults(handler=run)


def run(args) -> int:
    """Resolve PATH, write each model directory under --out, print what went where."""
    quiet_libraries()
    if args.base is not None and not args.merge:  # a copied adapter keeps the base it names: --base would be ignored
        raise UsageError(f"--base {args.base}: only --merge uses a base (a copied adapter keeps the one it names in "
                         "adapter_config.json); add --merge, or drop --base")
    with usage_errors(*training_errors()):
        models = exported_models(Path(args.path))
        out = Path(args.out)
        for name, source in models.items():
            target = out if len(models) == 1 else out / name
            print(f"wrote {target} ({export_one(source, target, args.merge, args.base)})")
    return 0


def exported_models(path: Path) -> dict[str, Path]:
    """Directory name -> model or adapter directory named by PATH (module docstring)."""
    from trainers.runs.layout import MODEL_FILES, checkpoint_models, resolve_checkpoint

    if any((path / name).is_file() for name in MODEL_FILES):
        return {path.name: path}
    checkpoint = resolve_checkpoint(str(path))
    return {directory.name: directory for directory in checkpoint_models(checkpoint).values()}


def export_one(source: Path, target: Path, merge: bool, base: str | None) -> str:
    """Write one model directory to `target`; returns what was written, in words."""
    from trainers.policy.adapters import export_merged, is_adapter_dir
    from trainers.runs.atomic import write_directory_atomically

    adapter = is_adapter_dir(source)
    if adapter and merge:
        export_merged(source, target, base)
        return f"{source.name} merged into its base: a standalone model"
    if base is not None and not adapter:
        raise UsageError(f"--base {base}: {source} is a full model, not a LoRA adapter")
    write_directory_atomically(target, lambda tmp: shutil.copytree(source, tmp, dirs_exist_ok=True))
    return "a LoRA adapter on its base, as saved" if adapter else "a full model, as saved"
