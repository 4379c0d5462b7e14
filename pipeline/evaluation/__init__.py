"""Evaluation of predicted attention graphs: graph metrics sweep, quality with predicted graphs, Pareto fronts
and the report."""
