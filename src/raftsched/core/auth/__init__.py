"""The auth feature: replicated API tokens (issue 15).

Only a SHA-256 hash of each secret is replicated; the node keeps an index
from hash to token (`tokens.find_by_hash`) so that a replica refuses a
revoked secret as soon as it applies the revocation.
"""
