"""Pure functions over a run: metrics, decompositions, timelines, roofline, comparison.

Analyzers never import torch, triton or textual: a run recorded on a GPU node is analysed
anywhere.
"""
