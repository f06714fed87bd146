"""Helpers of bench/versus_postgres.py: raftsched against a Postgres queue.

- common: the workload both sides carry (payload, result, batch size) and
  the control file through which the benchmark starts and stops its load
  processes and reads their counters.
- agent: the load processes (submitters, workers, the idle client, the due
  submitter, the preloader), one OS process each, for either system.
- postgres: the two Postgres configurations (setup, schema, the queue's SQL).
- systems: the three systems under test behind one interface.
- measure: CPU time per process tree and for the whole machine.
- phases: one measured phase, driven from the benchmark process.
"""
