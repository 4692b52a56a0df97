from trainers.cli.main import main

raise SystemExit(main())
