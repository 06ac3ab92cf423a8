"""The gateway's REST door: openwop RFC 0059's file store and runs, Quill's approvals and
workspaces, and the OpenAPI document that describes them.

``router``     the routes the app includes (``routes(access)``)
``edge``       what every route shares: errors by the one table, the caller's workspace, bounded
               bodies and counts
``files``      ``/v1/host/workspace/files[/{path}]`` and discovery (``/.well-known/openwop``)
``reading``    a file read whole or at a file version, a listing's metadata
``runs``       ``/v1/runs[/{runId}[/cancel]]``
``approvals``  ``/v1/approvals/{approvalId}``
``workspaces`` ``/v1/workspaces[/{name}[/archive|/unarchive]]``
``openapi``    ``/openapi.json``
"""
