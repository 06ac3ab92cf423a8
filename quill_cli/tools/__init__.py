"""Tools over the log alone: replay, verify, runs, export and import (``replay``), and scrub."""
