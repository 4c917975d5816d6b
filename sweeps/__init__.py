"""Sweeps and capacity searches: many runs, each a normal run, and what they show together."""
