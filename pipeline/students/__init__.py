"""Sparse-attention students: how they are trained and evaluated beyond plain dense inference."""
