"""The gateway: Quill's HTTP front door (MCP at ``/mcp``, WAP at ``/mcp/wap``, REST at ``/v1``).

A stateless client of the bus: every operation goes through the SDK (``quill.client``).
Wiring is in ``app.py``; who may reach which workspace in ``principals.py``; the MCP tools in
``mcp_files.py``/``mcp_quill.py`` (texts and errors in ``texts.py``), WAP in ``wap.py``, REST in
``rest.py``. See ``docs/gateway.md``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("quill")
    """The gateway's version: the package's (``/health``, MCP ``serverInfo``, OpenAPI)."""
except PackageNotFoundError:  # running from a source tree that was never installed
    VERSION = "0.0.0"
