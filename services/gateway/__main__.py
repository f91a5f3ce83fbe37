"""`python -m services.gateway` runs the HTTP API."""

from .main import main

main()
