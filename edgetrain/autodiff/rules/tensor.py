"""Gradient rules of the tensor family (placeholder while being written)."""
