"""Benchmarks: each Quill figure is printed next to a baseline measured in the same run."""
