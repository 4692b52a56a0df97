"""`marl export PATH --out DIR [--merge | --gguf]`: a checkpoint's models as directories (or GGUF files) to keep,
share or serve.

    marl export runs/relay --out exported                 the newest checkpoint's model directories, as saved
    marl export runs/relay --out exported --merge         LoRA adapters merged into their base: standalone models
    marl export runs/relay/checkpoints/step-000200/model --out merged --merge    one directory
    marl export runs/relay --gguf --out relay.gguf        one GGUF file for llama.cpp and Ollama (--dtype f16: half)

PATH is a run directory (its newest complete checkpoint), a checkpoints/step-N directory, or one model
or adapter directory. A checkpoint with one model writes it to DIR; with several (model/, model-<agent>/)
each goes to DIR/<its name>. Without --merge a LoRA adapter is copied as it is (it still needs its base:
adapter_config.json and marl_base.json name it); with --merge it is merged into its base (the one it
names, or --base) and written as a standalone Hugging Face directory that plain transformers loads.
A full model (a run without train.lora) is copied either way.

With --gguf each model is written as one GGUF file (trainers/policy/gguf_export.py; an adapter merged into
its base first): --out is that file when it ends in .gguf (a checkpoint with one model), else a folder
that gets <name>.gguf per model. A model GGUF cannot hold (not a Llama or Qwen2, not a byte-level BPE
tokenizer) is one line and exit status 2, checked from its config.json and tokenizer.json before any
weights are read; a file is written whole or not at all.

Every source and target is checked before the first byte is written, each problem one line and exit
status 2: a source marl would not load (a FIFO or device among its files, pickle-only or truncated
weights: common/model_files.py), an --out that is a file, a folder of other files (an earlier export is
replaced whole; anything else is never deleted), under a file, or in a folder that cannot be written (read-only).
A write that fails midway (a full disk) is one line too; the copy is made in a temporary sibling and
renamed into place, so an earlier export of that name is kept as it was.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from common.files import write_directory_atomically
from common.model_files import adapter_folder_problem, model_folder_problem
from trainers.cli.common import UsageError, path_value, quiet_libraries, training_errors, usage_errors
from trainers.policy.adapters import export_merged, is_adapter_dir, recorded_base_dir
from trainers.policy.gguf_export import GGUFExportError, export_problem, write_gguf
from trainers.records.layout import MODEL_FILES, checkpoint_models, resolve_checkpoint


def add_parser(commands) -> None:
    """Register `marl export PATH --out DIR`."""
    export = commands.add_parser("export", help="write a checkpoint's models to a directory (--merge: LoRA adapters "
                                                "merged into their base, standalone)")
    export.add_argument("path", metavar="PATH", type=path_value,
                        help="a run directory, a checkpoints/step-N directory, or one model "
                             "or adapter directory")
    export.add_argument("--out", required=True, metavar="DIR", type=path_value, help="where the model directories go")
    export.add_argument("--merge", action="store_true", help="merge LoRA adapters into their base: standalone models")
    export.add_argument("--base", metavar="DIR", type=path_value,
                        help="the adapters' base model directory (default: the one each "
                             "adapter names)")
    export.add_argument("--gguf", action="store_true", help="write each model as a GGUF file for llama.cpp and Ollama "
                                                            "(an adapter merged into its base first); --out FILE.gguf")
    export.add_argument("--dtype", choices=("f32", "f16"), default="f32", help="--gguf's tensor type (f16: half the "
                                                                               "size; default f32, the weights as trained)")
    export.set_defaults(handler=run)


def run(args) -> int:
    """Resolve PATH, write each model directory under --out, print what went where."""
    quiet_libraries()
    if args.gguf:
        return run_gguf(args)
    if args.dtype != "f32":
        raise UsageError(f"--dtype {args.dtype}: only --gguf writes tensors in another type; add --gguf, or drop --dtype")
    if args.base is not None and not args.merge:  # a copied adapter keeps the base it names: --base would be ignored
        raise UsageError(f"--base {args.base}: only --merge uses a base (a copied adapter keeps the one it names in "
                         "adapter_config.json); add --merge, or drop --base")
    with usage_errors(*training_errors()):
        models = exported_models(Path(args.path))
        out = Path(args.out)
        targets = {name: out if len(models) == 1 else out / name for name in models}
        for name, source in models.items():  # every source and target checked before the first is written
            check_source(source)
            check_target(out, targets[name])
        for name, source in models.items():
            with writing(out, source, targets[name]):
                print(f"wrote {targets[name]} ({export_one(source, targets[name], args.merge, args.base)})")
    return 0


def check_source(source: Path) -> None:
    """UsageError (one line) when the model or adapter folder is not one marl loads: a FIFO or device among
    its files (a copy would wait or never end), pickle-only or truncated weights, no tokenizer."""
    problem = adapter_folder_problem(source) if is_adapter_dir(source) else model_folder_problem(source)
    if problem is not None:
        raise UsageError(problem)


def check_target(out: Path, target: Path) -> None:
    """UsageError (one line) when the model directory `target` cannot be written, or writing it would replace
    what is not an earlier export: a file, a folder of other files, a folder that cannot be written in."""
    if target.exists() and not target.is_dir():
        raise UsageError(f"--out {out}: {target} is a file; give a folder path (a new one, or an earlier export, "
                         "which is replaced whole)")
    if target.is_dir() and any(target.iterdir()) and not any((target / name).is_file() for name in MODEL_FILES):
        raise UsageError(f"--out {out}: {target} holds files that are not a model (no config.json or "
                         "adapter_config.json); give a new or empty folder, or an earlier export to replace")
    check_writable(out, target)


def check_writable(out: Path, target: Path) -> None:
    """UsageError (one line) when `target` cannot be made: the folder it goes in (or the nearest one that
    exists) is a file, or is not writable (permission, a read-only file system). The new copy is made
    beside `target` and renamed into place, so that folder is the one written."""
    folder = next(parent for parent in target.absolute().parents if parent.exists())
    if not folder.is_dir():
        raise UsageError(f"--out {out}: {folder} is a file, not a folder; give a path in a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: cannot write in {folder} (permission denied or a read-only file system); "
                         "give a folder you can write to")


@contextmanager
def writing(out: Path, source: Path, target: Path):
    """Inside the block, an OSError of writing `target` (a full disk, a folder made read-only meanwhile) is one
    line: the copy is made in a temporary sibling and renamed into place, so an earlier `target` is kept."""
    earlier = target.exists()
    try:
        yield
    except OSError as error:
        kept = f"the earlier {target} is kept as it was" if earlier else "nothing was written"
        raise UsageError(f"--out {out}: writing {target} from {source} failed ({error.strerror or error}); "
                         f"{kept}") from None


def exported_models(path: Path) -> dict[str, Path]:
    """Directory name -> model or adapter directory named by PATH (module docstring)."""
    if any((path / name).is_file() for name in MODEL_FILES):
        return {path.name: path}
    checkpoint = resolve_checkpoint(str(path))
    return {directory.name: directory for directory in checkpoint_models(checkpoint).values()}


def export_one(source: Path, target: Path, merge: bool, base: str | None) -> str:
    """Write one model directory to `target`; returns what was written, in words."""
    adapter = is_adapter_dir(source)
    if adapter and merge:
        export_merged(source, target, base)
        return f"{source.name} merged into its base: a standalone model"
    if base is not None and not adapter:
        raise UsageError(f"--base {base}: {source} is a full model, not a LoRA adapter")
    write_directory_atomically(target, lambda tmp: shutil.copytree(source, tmp, dirs_exist_ok=True))
    return "a LoRA adapter on its base, as saved" if adapter else "a full model, as saved"


def run_gguf(args) -> int:
    """`marl export PATH --gguf --out FILE.gguf|DIR`: every model of PATH as a GGUF file, each checked first."""
    with usage_errors(*training_errors()):
        models = exported_models(Path(args.path))
        targets = gguf_targets(models, Path(args.out))
        for source in models.values():  # every model checked before the first is written
            _check_gguf_source(source, args.base)
        for name, source in models.items():
            with tempfile.TemporaryDirectory(prefix="marl-export-") as scratch, writing(Path(args.out), source,
                                                                                         targets[name]):
                directory = _full_model(source, args.base, Path(scratch))
                write_gguf(directory, targets[name], args.dtype, log=lambda line: print(line, file=sys.stderr))
            print(f"wrote {targets[name]} ({source.name}{' merged into its base' if directory != source else ''}, "
                  f"GGUF {args.dtype.upper()}, for llama.cpp and Ollama)")
    return 0


def gguf_targets(models: dict[str, Path], out: Path) -> dict[str, Path]:
    """Model name -> the GGUF file it is written to: `out` itself when it names a .gguf file, else out/<name>.gguf."""
    if out.suffix.lower() == ".gguf":
        if len(models) > 1:
            raise UsageError(f"--out {out}: the checkpoint has {len(models)} models ({', '.join(models)}); give a "
                             "folder, which gets one <name>.gguf each")
        targets = {name: out for name in models}
    else:
        targets = {name: out / f"{name}.gguf" for name in models}
    for target in targets.values():
        if target.is_dir():
            raise UsageError(f"--out {out}: {target} is a folder; give a file path ending in .gguf, or another folder")
        check_writable(out, target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"--out {out}: cannot create the folder {target.parent}: {error.strerror or error}") from None
    return targets


def _check_gguf_source(source: Path, base: str | None) -> None:
    """GGUFExportError (one line) when the model, or an adapter's base, cannot be written as GGUF."""
    if base is not None and not is_adapter_dir(source):
        raise UsageError(f"--base {base}: {source} is a full model, not a LoRA adapter")
    directory = (Path(base) if base is not None else recorded_base_dir(source)) if is_adapter_dir(source) else source
    if (problem := export_problem(directory)) is not None:
        raise GGUFExportError(problem)


def _full_model(source: Path, base: str | None, scratch: Path) -> Path:
    """`source` itself, or (a LoRA adapter) its merge into its base written under `scratch`."""
    return export_merged(source, scratch / "merged", base) if is_adapter_dir(source) else source
