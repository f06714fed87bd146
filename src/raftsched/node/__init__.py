"""The node: Raft, the replicated state, and the leader's duties (`service.Node`).

The process that runs a node with its HTTP API is assembled above this
package, in `raftsched.process`; nothing here imports `raftsched.api`.
"""
