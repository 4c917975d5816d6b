"""Speculative decoding: proposers draft tokens, one target forward verifies them.

`proposer.py` is the contract between the engine and a proposer (n-gram lookup, a draft
model); the engine never looks inside a proposer, so each can be tested alone.
"""
