"""PAR, "Pay Attention when Required": stacks whose sublayers follow a pattern of self-attention and
feed-forward blocks, and the supernet search that finds where attention is needed."""
