# Chorus task runner. `make run` starts everything on embedded defaults;
# `make test` runs the whole suite against PostgreSQL and Redis.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

# `make run PORT=8001 HOST=0.0.0.0` to serve elsewhere; `make run VERBOSE=1` shows the
# processes' own output in the terminal instead of var/logs/stack.log.
HOST ?= 127.0.0.1
PORT ?= 8000
VERBOSE ?=

TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/chorus
TEST_REDIS_URL ?= redis://127.0.0.1:6379/9

.PHONY: install run migrate test test-postgres test-sqlite lint docs format

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The tests also run the cosyvoice2 adapter on the real upstream code (unpacked
# from ../shared/upstream by the tests): its Python dependencies, the `cosyvoice`
# extra (torch and torchaudio, ~4.7 GB), come with `make test`, not `make run`.
COSYVOICE_STAMP := $(VENV)/.cosyvoice-stamp
$(COSYVOICE_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,cosyvoice]'
	touch $(COSYVOICE_STAMP)

.PHONY: test-install
test-install: $(COSYVOICE_STAMP)

migrate: install
	$(PY) manage.py migrate --noinput

run: migrate
	$(PY) manage.py runstack --demo --host $(HOST) --port $(PORT)$(if $(VERBOSE), --verbose)

# Two passes: everything on PostgreSQL, then the tests marked `embedded` (the
# ones that matter for `make run`: quota races, streaming, the load test, chaos)
# again on SQLite, the embedded default. Exit status 5 is "no test selected".
# The import contracts first (seconds): CI runs `make test`, and so keeps them.
test: lint-imports test-postgres test-sqlite

# Layers and no import cycles ([tool.importlinter] in pyproject.toml).
.PHONY: lint-imports
lint-imports: install
	$(VENV)/bin/lint-imports

# In TEST_PROCESSES processes (pytest-xdist): each has a Redis database (from
# TEST_REDIS_URL's on), a data folder and a test database of its own
# (tests/parallel.py); the cluster scenarios all go to one of them.
# `make test TEST_PROCESSES=0` runs everything in this one process.
# Three on 2 cores: the end-to-end tests wait on the workers and servers they
# start, which left a third of the cores idle with two (12 min instead of 18).
TEST_PROCESSES ?= 3
PYTEST := $(PY) -m pytest $(if $(filter-out 0,$(TEST_PROCESSES)),-p tests.parallel -n $(TEST_PROCESSES) --dist loadgroup)

test-postgres: test-install
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) \
	CHORUS_FAST_PASSWORD_HASHER=true CHORUS_DATA_DIR=$(CURDIR)/var/test \
	$(PYTEST) -m "not sqlite_only" $(PYTEST_ARGS)

test-sqlite: test-install
	mkdir -p $(CURDIR)/var/test-sqlite
	DATABASE_URL=sqlite:///$(CURDIR)/var/test-sqlite/chorus.sqlite3 REDIS_URL=$(TEST_REDIS_URL) \
	CHORUS_FAST_PASSWORD_HASHER=true CHORUS_DATA_DIR=$(CURDIR)/var/test-sqlite \
	$(PYTEST) -m "embedded or sqlite_only" $(PYTEST_ARGS) || [ $$? -eq 5 ]

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy chorus chorus_loadtest tenants synthesis quotas batches webhooks audit
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml, docs/): strict, so a broken link or anchor, or a
# page left out of the nav, fails it. CI runs it before the tests.
docs: install
	$(VENV)/bin/mkdocs build --strict --site-dir $(CURDIR)/var/site

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .
