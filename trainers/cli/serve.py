"""`marl serve MODEL_DIR`: a local model on an OpenAI-compatible endpoint (the server is trainers/policy/serve.py)."""

from __future__ import annotations

from trainers.cli.common import UsageError, quiet_libraries


def add_parser(commands) -> None:
    """Register `marl serve MODEL_DIR`."""
    serve = commands.add_parser("serve", help="serve a local model on an OpenAI-compatible endpoint")
    serve.add_argument("model_dir", metavar="MODEL_DIR", help="a Hugging Face causal-LM directory")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    serve.add_argument("--name", help="model name clients must ask for (default: the directory name)")
    serve.set_defaults(handler=run)


def run(args) -> int:
    """Serve until Ctrl-C; a bad port, a missing or broken model, or a busy address is one line, exit 2."""
    quiet_libraries()
    from trainers.policy.serve import ModelLoadError, serve

    try:
        serve(args.model_dir, args.host, args.port, args.name)
    except (ValueError, ModelLoadError, FileNotFoundError) as error:  # checked before anything is served
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}") from None
    return 0
