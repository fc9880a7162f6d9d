"""The idempotency gateway: an ASGI reverse proxy that runs each key once."""
