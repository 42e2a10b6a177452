"""Gradient rules of the math family (placeholder while being written)."""
