"""The reference pages of the docs site, generated from the code so that they cannot drift from it.

    generate.py  the pages: the scenario file reference (from the pydantic schema, marl.scenario.spec, and
                 the rule verifiers' parameters), the CLI reference (from trainers.cli.main.build_parser)
                 and the metrics list (from metrics.py)
    metrics.py   every metric a run logs, as a declared table; a test plays a real step and checks every key
                 it logs against the table
    __main__.py  `python -m trainers.cli.docs` writes the pages into docs/reference/; `--check` lists the stale
                 ones and exits 1 (tests/test_docs.py fails on a stale page the same way)

May import: the CLI's parser (trainers.cli.main), marl's scenario schema and options, judges' rule registry;
nothing imports this room.
"""
