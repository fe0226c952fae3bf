"""Alembic migrations of the results database."""
