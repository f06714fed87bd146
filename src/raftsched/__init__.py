"""raftsched: a distributed job scheduler on a Raft-replicated state machine."""
