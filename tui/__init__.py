"""The Textual trace explorer (`perfdiag tui`)."""
