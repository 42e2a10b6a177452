"""Gradient rules of the nn family (placeholder while being written)."""
