"""``python -m quill_cli``: the CLI, as ``python -m quill`` and the ``quill`` script."""

from quill_cli.cli import main

main()
