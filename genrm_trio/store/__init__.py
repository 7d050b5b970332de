"""Durable state: the store protocol the engine writes through, and the SQLite store."""
