"""``python -m atoll.control.cli``: the same as the ``atoll`` console script."""

from atoll.control.cli import main

raise SystemExit(main())
