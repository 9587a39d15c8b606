"""OpenAI-compatible HTTP server: `flashstate serve` (app.py is the map)."""
