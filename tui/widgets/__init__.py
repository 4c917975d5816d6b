"""Widgets and character-cell charts of the explorer."""
