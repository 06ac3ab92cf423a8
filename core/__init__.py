"""The pure core: the tree and its nodes, a workspace's state, deciding a command (files and
control), folding an event into a state, the projection plan, answers, finding, secrets
matching. No I/O, no clock, no event loop (pyproject.toml [tool.importlinter] forbids them):
everything here is a function of its arguments, tested without NATS."""
