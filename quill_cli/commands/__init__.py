"""The ``quill`` CLI's commands, one module per group; each defines its commands on its own
``commands`` (``quill_cli.common.Commands``) and ``quill_cli/cli.py`` adds them to ``quill``.
No module here imports another, nor ``cli.py``: what they share is ``quill_cli/common.py``."""
