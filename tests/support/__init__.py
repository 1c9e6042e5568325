"""Helpers the tests share: plain functions and classes, no tests and no fixtures (fixtures live in conftest.py)."""
