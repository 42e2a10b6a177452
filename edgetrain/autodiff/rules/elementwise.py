"""Gradient rules of the elementwise family (placeholder while being written)."""
