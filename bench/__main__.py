"""``python -m bench [core] [log] [search] [gateway] [executor] [retention] [load] [replay]
[cluster] [size] [console] [bootstrap] [scale] [depth] [hot] [fork] [purge]``: the benchmarks
(all by default), each figure printed next to its baseline measured in the same run."""

import argparse
import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench import (
    bootstrap,
    cluster,
    console,
    core,
    depth,
    executor,
    fork,
    gateway,
    hot,
    load,
    log,
    purge,
    replay,
    retention,
    scale,
    search,
    size,
)

parser = argparse.ArgumentParser(prog="python -m bench")
PARTS = [
    "core",
    "log",
    "search",
    "gateway",
    "executor",
    "retention",
    "load",
    "replay",
    "cluster",
    "size",
    "console",
    "bootstrap",
    "scale",
    "depth",
    "hot",
    "fork",
    "purge",
]
parser.add_argument(
    "which", nargs="*", choices=PARTS, help="Default: all but bootstrap, scale, depth and fork."
)
parser.add_argument("--seconds", type=float, default=4.0, help="Seconds per measured round.")
parser.add_argument("--rounds", type=int, default=3, help="Rounds per figure (median shown).")
parser.add_argument("--versions", type=int, default=10_000, help="Versions of the history file.")
parser.add_argument(
    "--gateway-workers", type=int, help="gateway: its processes (default: quill up's)."
)
parser.add_argument("--files", type=int, default=size.FILES, help="size, console: files.")
parser.add_argument(
    "--events", type=int, help=f"size, console: events ({size.EVENTS:,}); bootstrap: its log's"
)
parser.add_argument(
    "--workspaces",
    type=int,
    default=None,
    help="bootstrap: workspaces; scale: the steps up to this one (instead of --max).",
)
parser.add_argument("--max", type=int, default=100_000, help="scale: the largest step.")
parser.add_argument("--plot", type=Path, help="scale: draw the figures into this PNG.")
parser.add_argument("--samples", type=int, default=scale.SAMPLES, help="scale: per figure.")
parser.add_argument(
    "--build",
    choices=["batches", "commands"],
    default="batches",
    help="scale: make the workspaces by the log's batches and the projections' apply "
    "(fast), or through the writer's commands (the real path, ~500 a second here).",
)
parser.add_argument("--tail", type=int, default=bootstrap.TAIL, help="bootstrap: tail events.")
parser.add_argument(
    "--keep", type=Path, help="bootstrap: keep the log here; again: only the start measured."
)
parser.add_argument(
    "--max-events", type=int, default=depth.EVENT_STEPS[-1], help="depth: the largest history."
)
parser.add_argument(
    "--max-files", type=int, default=depth.FILE_STEPS[-1], help="depth: the largest tree."
)
parser.add_argument(
    "--fast",
    action="store_true",
    help="depth: append the histories' logs directly; fork: fewer events.",
)
parser.add_argument(
    "--history", type=int, default=0, help="hot: also write this many events to one workspace."
)
parser.add_argument(
    "--full", action="store_true", help=f"purge: a source of {purge.FILES:,} files (else fewer)."
)
parser.add_argument("--sandbox", default="bwrap", help="depth: the executor's sandbox.")
args = parser.parse_args()
which = args.which or [p for p in PARTS if p not in ("bootstrap", "scale", "depth", "fork")]
SIMPLE: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
    "core": lambda: core.main(args.seconds, args.versions, args.rounds),
    "hot": lambda: hot.main(args.seconds, args.rounds, args.history),
    "log": log.main,
    "search": search.main,
    "gateway": lambda: gateway.main(args.seconds, args.rounds, args.gateway_workers),
    "executor": executor.main,
    "retention": retention.main,
    "load": lambda: load.main(args.seconds * 5),
    "replay": lambda: replay.main(args.rounds),
    "cluster": lambda: cluster.main(args.seconds, args.rounds),
    "size": lambda: size.main(args.files, args.events or size.EVENTS),
    "console": lambda: console.main(args.files, args.events or size.EVENTS),
    "purge": lambda: purge.main(args.full),
}
"""The parts run with their options alone, in this order; the first six end in a blank line."""
for n, (part, run) in enumerate(SIMPLE.items()):
    if part in which:
        asyncio.run(run())
        if n < 6:
            print()
if "bootstrap" in which:
    events = args.events or bootstrap.EVENTS
    workspaces = args.workspaces or bootstrap.WORKSPACES
    asyncio.run(bootstrap.main(events, workspaces, args.tail, args.keep))
if "scale" in which:
    steps = (
        (*[s for s in scale.STEPS if s < args.workspaces], args.workspaces)
        if args.workspaces
        else scale.STEPS
    )
    asyncio.run(
        scale.main(
            args.max if not args.workspaces else args.workspaces,
            args.samples,
            args.seconds,
            args.plot,
            steps,
            args.build == "batches",
        )
    )
if "depth" in which:
    samples = args.samples if args.samples != scale.SAMPLES else depth.SAMPLES
    asyncio.run(
        depth.main(args.max_events, args.max_files, samples, args.fast, args.sandbox, args.plot)
    )
if "fork" in which:
    asyncio.run(fork.main(args.max_files if args.max_files != depth.FILE_STEPS[-1] else fork.FILES,
                          args.events, args.fast))  # fmt: skip
