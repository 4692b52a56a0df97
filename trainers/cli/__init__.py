"""The `marl` command line: `main.py` registers the commands, one module per command.

May import anything below it (jobs, rooms, marl, judges); nothing imports the CLI.
"""
