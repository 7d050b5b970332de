"""Pure: the rules and records of scoring. No I/O: no trio, httpx, quart, hypercorn or sqlite3."""
