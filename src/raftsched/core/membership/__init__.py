"""The membership feature: the replicated directory of coordinators (issue 16).

Imports only the kernel. See `members` for the theory of operation.
"""
