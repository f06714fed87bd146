# Two commands matter (see README): `make dev` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: dev test lint typecheck diagrams check mutate bench bench-core bench-cluster bench-schedules bench-hot-minute bench-versus-postgres bench-ten-million bench-shards bench-scale-plot chaos chaos-long clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

## Start a local 3-node cluster with a demo worker (Ctrl-C stops it).
dev: $(STAMP)
	$(VENV)/bin/raftsched dev $(ARGS)

## Run the whole test suite (unit, property, end-to-end) plus lint and types.
## Whole test files run in PYTEST_WORKERS processes at once (0: one process,
## in order); the files with slow tests start first (tests/conftest.py).
PYTEST_WORKERS ?= 3
test: $(STAMP)
	$(MAKE) lint typecheck
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench chaos
	$(VENV)/bin/ruff format --check src tests bench chaos
	$(VENV)/bin/lint-imports --no-cache

typecheck: $(STAMP)
	$(VENV)/bin/mypy

## Redraw the state diagrams in docs/ from the core's transition tables
## (tests/core/test_core_diagrams.py fails when they differ).
diagrams: $(STAMP)
	$(PY) -m raftsched.diagrams docs

## Mutation testing of the fencing, lease, effects, idempotency and journal code
## (docs/mutation.md). Not part of `make test` or CI; one worker, so it is slow.
MUTATE_STAMP := $(VENV)/.mutation-installed
$(MUTATE_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,mutation]'
	touch $(MUTATE_STAMP)

mutate: $(MUTATE_STAMP)
	$(VENV)/bin/mutmut run --max-children 1 $(MUTATE_ARGS)
	$(VENV)/bin/mutmut results

## Benchmarks (not tests; each prints one JSON object as its last line).
## BENCH_ARGS passes options, e.g. BENCH_ARGS=--quick or BENCH_ARGS="--jobs 200000".
bench: bench-core bench-cluster bench-schedules bench-hot-minute

bench-core: $(STAMP)
	$(PY) bench/core.py $(BENCH_ARGS)

bench-cluster: $(STAMP)
	$(PY) bench/cluster.py $(BENCH_ARGS)

bench-schedules: $(STAMP)
	$(PY) bench/schedules.py $(BENCH_ARGS)

bench-hot-minute: $(STAMP)
	$(PY) bench/hot_minute.py $(BENCH_ARGS)

## raftsched against a Postgres queue (primary + 2 quorum standbys, and one
## node), interleaved rounds (~20 min; needs Debian's postgresql package).
## Not part of `make bench`. E.g. BENCH_ARGS="--quick" or "--protocol next".
bench-versus-postgres: $(STAMP)
	$(PY) bench/versus_postgres.py $(BENCH_ARGS)

## Ten million jobs in a 3-node cluster with fsync (issue 19; docs/scale.md): an hour or
## more at the default 10,000,000. Not part of `make bench`. E.g. BENCH_ARGS="--jobs 1000000
## --out bench-1m.json"; a smoke: BENCH_ARGS="--jobs 50000 --log-compaction-entries 200".
bench-ten-million: $(STAMP)
	$(PY) bench/ten_million.py $(BENCH_ARGS)

## 3 nodes x S data shards, S = 1, 2, 4 (issue 21; docs/shards.md, section 8): jobs/s
## and each shard leader's CPU per job (~4 min; BENCH_ARGS=--quick ~1.5 min).
bench-shards: $(STAMP)
	$(PY) bench/shards.py $(BENCH_ARGS)

## docs/scale.png from ten_million results (needs the bench extra: matplotlib).
## E.g. PLOT_ARGS="bench-1m.json bench-3m.json bench-10m.json".
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench-scale-plot: $(BENCH_STAMP)
	$(PY) bench/scale_plot.py --out docs/scale.png $(PLOT_ARGS)

## Seeded chaos campaign (root: network namespaces, iptables, libfaketime). docs/chaos.md
SEED     ?= 1
DURATION ?= 180
NODES    ?= 3
SHARDS   ?= 1
chaos: $(STAMP)
	PYTHONPATH=. $(PY) -m chaos --seed $(SEED) --duration $(DURATION) --nodes $(NODES) --shards $(SHARDS) $(CHAOS_ARGS)

## The long campaign: 5 nodes, 12 minutes, every fault kind, the mixed-version phase (~15 min)
chaos-long: $(STAMP)
	PYTHONPATH=. $(PY) -m chaos --seed 7 --duration 720 --nodes 5 --mixed-version --recovery-bound-s 90 $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache mutants
