"""Model construction and loading."""
