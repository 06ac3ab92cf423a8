"""HTTP runtime under a front door (the gateway): what every request goes through whatever
route serves it, and how the process serves a port.

``server``      listening (``listen``), uvicorn told when it is up (``Server``), ``settle_heap``
``bounds``      a request's head and body bounded in size and time (``HeaderDeadline``,
                ``BodyBounds``)
``inflight``    at most so many requests served at once, busy past it (``Inflight``, ``Slots``)
``streams``     server-sent event streams counted per principal, apart from requests
``requestids``  ``X-Request-Id``, followed into the commands a request sends
``redaction``   no registered secret in any response's headers or body
``metrics``     every request counted and timed by route (``HttpMetrics``), ``GET /metrics``
``workers``     several processes on one port (``SO_REUSEPORT``), restarted when they exit
``scrape``      one ``/metrics`` for several workers
"""
