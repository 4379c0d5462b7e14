"""Learned sparse attention: α-entmax teachers, Sparsefinder predictors, sparse students.

Importing :mod:`pipeline.attention` registers the project's attention implementations with Hugging Face
transformers (``attn_implementation="entmax"``). The package root imports nothing, so a stage that never
touches attention (``prepare``) does not depend on its code.
"""
