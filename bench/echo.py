"""A bare nats-py request/reply echo responder (the read baseline), run as its own process."""

from __future__ import annotations

import asyncio
import sys

import nats
from nats.aio.msg import Msg


async def main(url: str) -> None:
    nc = await nats.connect(url)

    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe("bench.echo", queue="echo", cb=echo)
    await nc.flush()
    print("echo ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
