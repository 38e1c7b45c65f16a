"""`python -m verify ...`: see `verify.cli.main`."""

from verify.cli.main import main

raise SystemExit(main())
