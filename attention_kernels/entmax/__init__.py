"""α-entmax itself: α-entmax(z) = [(α − 1) z − τ]₊^{1/(α−1)} with τ such that the result sums to 1.

- :mod:`attention_kernels.entmax.dense`: the dense normaliser over the last dimension (−inf = excluded), the
  reference every kernel is tested against.
- :mod:`attention_kernels.entmax.threshold`: the one threshold solver (safeguarded Newton on F(τ) = 1, exact
  last step for α = 1.5 and 2) that the bucketed and indexed paths share.
- :mod:`attention_kernels.entmax.gradient`: the Jacobian's weights g = p^{2−α}.
- :mod:`attention_kernels.entmax.support_sums`: the row sums that locate τ, fused into one pass.

Importing this package loads none of them.
"""
