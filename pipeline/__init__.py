"""Learned sparse attention: α-entmax teachers, Sparsefinder predictors, sparse students.

Importing the package registers its attention implementations with Hugging Face transformers.
"""

from pipeline import attention  # noqa: F401
