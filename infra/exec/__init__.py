"""Running commands and git on a tree of files, shared by the executor (a sandboxed checkout
of the log) and the bridge (a folder on its user's disk).

``sandbox``   the providers: bwrap (namespaces, seccomp, cgroups) and local (a plain process)
``git``       structured, hardened git actions (``run_git``)
``checkout``  a workspace materialised from the log, and the capture of what a command changed
``commit``    a capture committed as one ``apply`` (what would carry a secret withheld)
``results``   what a command's result shows of its output, redacted, and the ``CommandResult``
``answer``    an exec request in hand: its timeout, live output, heartbeats, answer and audit
"""
