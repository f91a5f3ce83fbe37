"""`python -m services.gateway` runs the HTTP API."""

from .main import main

__all__: list[str] = []

main()
