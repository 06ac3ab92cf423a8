"""``python -m bench``: every benchmark, each figure next to its baseline."""

import argparse
import asyncio

from bench import core

parser = argparse.ArgumentParser(prog="python -m bench")
parser.add_argument("--seconds", type=float, default=4.0, help="Seconds per measured round.")
parser.add_argument("--rounds", type=int, default=3, help="Rounds per figure (median shown).")
parser.add_argument("--versions", type=int, default=10_000, help="Versions of the history file.")
args = parser.parse_args()
asyncio.run(core.main(args.seconds, args.versions, args.rounds))
