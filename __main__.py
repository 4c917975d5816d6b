"""`python -m perfdiag` is the `perfdiag` command."""

from .cli import main

main()
