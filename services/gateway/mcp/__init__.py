"""The gateway's MCP endpoints, ``/mcp`` and ``/mcp/wap``: tool tables served by one engine.

``endpoints``    the two endpoints assembled from the tables (what the app includes), and the
                 ops no tool is (``NO_TOOL``), the operators' tools (``OPERATOR_TOOLS``)
``exchange``     the stateless JSON exchange over HTTP, answered in the request's task
``table``        a tool as a row: its op, parameters, request and rendering (``Tool``, ``Arg``)
``engine``       one tool call run: the caller, the workspace, the SDK call, the answer or the
                 error (``Tools``), argument errors, input schemas
``schemas``      the output schemas ``tools/list`` declares
``texts``        every word a model reads: answers and error texts
``elicitation``  a call parked for approval put to the client's user
``clients``      who a call is from when no token says (``clientInfo.name``, its session)
``sessions``     a caller's session: its primary workspace, the attached ones, where a call goes

The tables: ``files`` (the workspace tool's six), ``quill_tools`` (edits, search, history,
commands, git), ``reference`` (the reference filesystem server's), ``approvals``
(``wait_for_approval``), ``sessions`` and ``workspaces`` (the session's and the tenant's), and
``wap`` (``/mcp/wap``).
"""
