"""Figures and the CSV tables ``dvc plots show`` renders, drawn from the evaluation's JSON."""
