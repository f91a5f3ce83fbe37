"""`python3 -m executor`, with deploy/sandbox (or /opt/deckhands) and the repository root on
the path: the executor, as holder.py runs it."""

from . import main

main()
