"""grep over a workspace of 10,000 text files (~50 MB) against ripgrep over the same files on
disk, in one run: a selective literal, a selective regex and a common word."""

from __future__ import annotations

import asyncio
import random
import statistics
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

from bench.harness import quill_up, row, settle
from contracts import requests as rq
from quill.client import Quill

FILES = 10_000
LINES = 70  # ~5 KB a file
QUERIES = [
    # (label, pattern, literal, goal)
    ("selective literal", "XQZ_needle_4242", True, ">= 10x faster than rg"),
    ("selective regex", r"ERR-\d{5}-[A-Z]{3}", False, ">= 10x faster than rg"),
    ("common word", "the", True, ">= 0.83x (<= 1.2x rg's time)"),
]


def corpus(seed: int = 7) -> dict[str, str]:
    """Deterministic files: common words, a few rare needles, a few error codes."""
    rng = random.Random(seed)
    vocabulary = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
        for _ in range(5000)
    ] + ["the"] * 400
    files: dict[str, str] = {}
    for i in range(FILES):
        lines = [" ".join(rng.choice(vocabulary) for _ in range(10)) for _ in range(LINES)]
        if i % 2500 == 7:
            lines[rng.randrange(LINES)] += " XQZ_needle_4242"
        if i % 2000 == 3:
            lines[rng.randrange(LINES)] += f" ERR-{rng.randint(10000, 99999)}-ABC"
        files[f"pkg{i % 50}/mod{i // 50}/file{i}.txt"] = "\n".join(lines) + "\n"
    return files


def ripgrep() -> str:
    return str(Path(sysconfig.get_path("scripts")) / "rg")


def rg_time(pattern: str, literal: bool, root: Path, repeat: int) -> tuple[float, int]:
    """Median seconds of ``rg -c`` (count matching lines per file), and the total it counts."""
    args = [ripgrep(), "-c", *(["-F"] if literal else []), "-e", pattern, str(root)]
    times, total = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = subprocess.run(args, capture_output=True, text=True, check=False).stdout
        times.append(time.perf_counter() - t0)
        total = sum(int(line.rpartition(":")[2]) for line in out.splitlines() if line)
    return statistics.median(times), total


async def main(repeat: int = 5) -> None:
    files = corpus()
    size = sum(len(t) for t in files.values())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "tree"
        for path, text in files.items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        up, url = quill_up(Path(tmp) / "quill")
        try:
            quill = await Quill.connect(url, timeout=120)
            ws = quill.workspace("bench/search")
            await ws.create(exist_ok=True)
            items = list(files.items())
            t0 = time.perf_counter()
            for i in range(0, len(items), 200):
                await ws.apply([rq.PutChange(path=p, content=t) for p, t in items[i : i + 200]])
            written = time.perf_counter() - t0
            await settle(url, indexed=True)  # queries are measured on the reader's steady state
            indexed = time.perf_counter() - t0
            print(
                f"grep over {len(files):,} files ({size / 1e6:.0f} MB): Quill (via the SDK, a "
                f"reader process) vs ripgrep 14.1 on the same files on disk; median of {repeat}\n"
                f"written in {written:.1f} s (batches of 200), trigram-indexed by the reader "
                f"{indexed:.1f} s after the first write\n"
            )
            print(f"{'figure':<44} {'quill':>16} {'ripgrep':>16} {'ratio':>8}  goal")
            for label, pattern, literal, goal in QUERIES:
                await ws.grep(pattern, literal=literal)  # warm both
                rg_time(pattern, literal, root, 1)
                times = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    found = await ws.grep(pattern, literal=literal)
                    times.append(time.perf_counter() - t0)
                ours = statistics.median(times)
                theirs, rg_total = rg_time(pattern, literal, root, repeat)
                assert found.total == rg_total, (label, found.total, rg_total)
                speed = theirs / ours
                print(
                    row(
                        f"grep {label} ({found.total:,} lines)",
                        f"{ours * 1000:.1f} ms",
                        f"{theirs * 1000:.1f} ms",
                        speed,
                        goal + " (ratio: rg time / ours)",
                    )
                )
            await quill.close()
        finally:
            up.stop()


if __name__ == "__main__":
    asyncio.run(main())
