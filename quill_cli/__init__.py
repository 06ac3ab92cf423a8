"""The ``quill`` command: the CLI, the launcher (``quill up``, ``quill cluster up``), the
deployment and tenant files, the doc generator, and the log tools (``tools``: replay, verify,
export, import, scrub)."""
