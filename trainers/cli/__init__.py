"""The `marl` command line: `main.py` registers the commands, one module per command.

    main.py      builds the parser from the command modules and dispatches; `python -m trainers.cli` too
    common.py    what the commands share: UsageError, quiet_libraries, --set on a dataclass, common arguments
    demo.py, validate.py, rollout.py, credit.py, serve.py, run.py, eval.py, export.py, estimate.py, judges.py
                 one command each, every one with `add_parser(commands)` and `run(args)`
    docs/        the docs' reference pages generated from the parser, the scenario schema and the metrics
                 table (`python -m trainers.cli.docs`, `make docs-gen`); not a command

May import anything below it (jobs, rooms, marl, judges, common); nothing imports the CLI.
"""
