"""`python -m tools.cli`: the `deckhands` command without its entry point."""

from .app import main

main()
