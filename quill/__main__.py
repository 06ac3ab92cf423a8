"""``python -m quill``: the CLI (``quill_cli``), for a checkout without the ``quill`` script."""

from quill_cli.cli import main

main()
