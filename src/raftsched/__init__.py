"""raftsched: a distributed job scheduler on a Raft-replicated state machine."""

# The release this code is or will be (the package metadata in pyproject.toml
# follows at the tag). Nodes report it in GET /v1/cluster.
__version__ = "0.10.0"
