"""`python -m tools.eval` (`make eval`): run the task set on a deckhands stack and score it."""

from .cli import main

main()
