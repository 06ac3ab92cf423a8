"""The executor pool: runs commands and git actions in a sandbox against a materialised checkout
of the workspace, and commits the files they change as one event."""
