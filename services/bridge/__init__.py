"""Local workspaces: a bridge serves a folder on its user's machine as ``<tenant>/<name>``.

``quill attach DIR --as NAME`` claims the name (``infra.bridges``) and answers the
workspace's ``qry``, ``cmd`` and ``exec`` subjects itself, on the folder, with the replies and
errors of a server workspace; the writer, readers and executors stay silent on it. Its URI is
``<client>:<path>``. See ``docs/bridge.md``.

Modules
-------
``app``        ``Bridge``: claim, serve, renew, release; ``attach`` runs one until stopped
``handlers``   message → answer: parsing, the gate (order), approval, idempotent retries, audit
``folder``     the folder as a workspace: confinement, entries as ``Node``s, file versions
``queries``    the reader's answers (``core.answers``, ``finding``) over the folder
``changes``    the writer's decisions (``core.decide``) over a state read from the
               disk, applied to it
``commands``   ``exec.run`` and ``exec.git`` with the executor's local provider; what changed
``approvals``  the terminal and the approver: trust, policy, one question at a time
``policy``     the policy file
"""
