# Shortcuts; the scripts are the source of truth.
.PHONY: setup demo test lint fmt types bench

setup:
	scripts/setup

demo:
	scripts/demo

test:
	scripts/test

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

fmt:
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

types:
	.venv/bin/mypy

bench:
	.venv/bin/python bench/overhead.py
