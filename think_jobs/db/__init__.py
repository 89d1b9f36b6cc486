"""Persistence: tables, the engine, the store of named operations, and Alembic migrations."""
