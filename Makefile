# GPU Bank — the two promises of README.md: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# Services the tests use on localhost (the development and CI machines run them).
TEST_ENV := DJANGO_SETTINGS_MODULE=config.settings.test

.PHONY: run test lint check venv clean services browser

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: requirements.txt requirements-dev.txt | $(BIN)/python
	$(BIN)/pip install -q -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

# Embedded defaults: SQLite (IMMEDIATE), file-system Celery broker, in-memory channel layer,
# worker + beat + a demo fleet of fake GPU nodes, served at http://127.0.0.1:8000
# One /metrics for web, worker and beat: Prometheus multiprocess mode in a directory wiped at start.
run: venv
	mkdir -p var/celery/out var/celery/processed
	rm -rf var/prometheus && mkdir -p var/prometheus
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py collectstatic --noinput -v 0
	$(BIN)/python manage.py seed_demo
	PROMETHEUS_MULTIPROC_DIR=$(CURDIR)/var/prometheus $(BIN)/honcho -f Procfile.embedded start

services:
	@pg_isready -h 127.0.0.1 -p 5432 -q || pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start
	@redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 || redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no

# Headless Chromium for the browser tests, from Debian packages (never a Playwright download).
browser:
	@test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver)

lint: venv
	$(BIN)/ruff check .
	$(TEST_ENV) $(BIN)/python manage.py makemigrations --check --dry-run

# The whole suite on PostgreSQL and Redis on localhost, plus ruff and the migrations check.
test: venv services browser lint
	$(TEST_ENV) $(BIN)/python -m pytest -q

clean:
	rm -rf var staticfiles .pytest_cache
