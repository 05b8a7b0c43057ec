"""``python -m loaderx``: the ``loaderx`` command (see ``loaderx.cli``)."""

from .cli import main

raise SystemExit(main())
