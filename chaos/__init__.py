"""A Jepsen-style chaos harness for raftsched.

It runs a real cluster with every node in its own network namespace, real
worker processes, a fenced sink and client threads; a seeded nemesis injects
partitions, kills, pauses and clock jumps; every operation is recorded as
JSONL; checkers then prove (or refute) the guarantees. See docs/chaos.md.
Run it with `python -m chaos --seed 1` (as root) or `make chaos SEED=1`.
"""
