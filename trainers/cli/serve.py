"""`marl serve MODEL_DIR`: a local model on an OpenAI-compatible endpoint (the server is trainers/engine/server.py).

    marl serve runs/relay/checkpoints/step-000200/model      a full model, or a LoRA adapter directory
    marl serve smollm2-135m-instruct                         a GGUF file or packaged model (converted once)

A LoRA adapter directory (adapter_config.json, as a `train.lora` run's checkpoint holds) is served
merged into its base (the base it names, or --base DIR): the merge is written to a temporary
directory, served, and removed on exit. `marl export --merge` writes it to keep.
"""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path

from trainers.cli.common import UsageError, quiet_libraries
from trainers.engine.limits import ServeLimits
from trainers.engine.server import ModelLoadError, check_port, serve
from trainers.policy.adapters import export_merged, is_adapter_dir
from trainers.policy.gguf import is_gguf_source, resolve_model_dir
from trainers.policy.memory import check_model_fits


def add_parser(commands) -> None:
    """Register `marl serve MODEL_DIR`."""
    serve = commands.add_parser("serve", help="serve a local model on an OpenAI-compatible endpoint")
    serve.add_argument("model_dir", metavar="MODEL_DIR",
                       help="a Hugging Face causal-LM directory, a LoRA adapter directory (served merged "
                            "into its base), a .gguf file or smollm2-135m-instruct (converted once)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    serve.add_argument("--name", help="model name clients must ask for (default: the directory name)")
    serve.add_argument("--enable-lora", action="store_true",
                       help="allow runtime LoRA adapters (/v1/load_lora_adapter, as vLLM's --enable-lora): what "
                            "marl run's HTTP rollout engine (train.engine.kind: http) publishes its adapters through")
    serve.add_argument("--device", default="cpu", help="cpu (default), cuda, mps or auto: where the model runs")
    serve.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16 or auto (bfloat16 "
                                                          "on a GPU that has it): the weights' dtype")
    serve.add_argument("--base", metavar="DIR", help="an adapter's base model directory (default: the one the "
                                                     "adapter names)")
    limits = serve.add_argument_group("limits", "what one client may send and hold; a request beyond them is "
                                                "answered with an OpenAI-style JSON error (400, 408, 411, 413, 503)")
    for name, flag, kind, default, text in ServeLimits.flags():
        limits.add_argument(flag, dest=name, type=kind, default=default, metavar="N" if kind is int else "S",
                            help=text)
    serve.set_defaults(handler=run)


def limits_of(args) -> ServeLimits:
    """The ServeLimits of parsed `marl serve` arguments (ValueError naming the flag when one is out of range)."""
    return ServeLimits(**{name: getattr(args, name) for name, *_ in ServeLimits.flags()})


def run(args) -> int:
    """Serve until Ctrl-C; a bad port or limit, a missing or broken model, or a busy address is one line, exit 2."""
    quiet_libraries()
    from trainers.policy.loading import placement

    # SIGTERM (a service manager, `kill`) unwinds like Ctrl-C, so the merged copy below is removed too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        check_port(args.port)  # before a merge, which reads the whole model
        limits = limits_of(args)
        device, dtype = placement(args.device, args.dtype, section="serve", purpose="serve")  # one line, exit 2
        with tempfile.TemporaryDirectory(prefix="marl-serve-") as scratch:
            model_dir = servable_dir(args.model_dir, args.base, Path(scratch))
            check_model_fits(args.model_dir, model_dir, str(dtype), device)  # too large: one line now
            serve(model_dir, args.host, args.port, args.name or Path(args.model_dir).name,
                  enable_lora=args.enable_lora, device=device, dtype=dtype, limits=limits)
    except (ValueError, ModelLoadError, FileNotFoundError) as error:  # checked before anything is served
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}") from None
    return 0


def servable_dir(model_dir: str, base: str | None, scratch: Path) -> str:
    """`model_dir` itself, or (a LoRA adapter) its merge into its base written under `scratch`."""
    if is_gguf_source(model_dir):  # a .gguf file or a packaged model: its converted directory in the model cache
        if base is not None:
            raise UsageError(f"--base {base}: only for a LoRA adapter directory, and {model_dir} is a GGUF model")
        return str(resolve_model_dir(model_dir, log=lambda line: print(line, flush=True)))
    if not is_adapter_dir(model_dir):
        if base is not None:
            raise UsageError(f"--base {base}: only for a LoRA adapter directory, and {model_dir} is a full model "
                             "(no adapter_config.json)")
        return model_dir
    print(f"{model_dir} is a LoRA adapter: serving it merged into its base", flush=True)
    return str(export_merged(model_dir, scratch / "merged", base))
