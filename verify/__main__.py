"""`python -m verify ...`: see `verify.cli`."""

from verify.cli import main

raise SystemExit(main())
