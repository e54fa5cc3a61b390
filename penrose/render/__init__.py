"""Rendering: Penrose figures, index equations and geometric readings of a diagram."""
