"""`python -m trainers.cli`: the `marl` command."""

from trainers.cli.main import main

raise SystemExit(main())
