"""``quill cluster up``: a NATS cluster and the services as separate processes, on one
machine."""

from __future__ import annotations
