"""Test tools: the simulated judge, in process and as an HTTP server. Never a production default."""
