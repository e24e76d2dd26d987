"""Studies: small, self-contained experiments from the CS336 systems handout.

``attention`` times one attention layer over a grid of head sizes and sequence lengths
and sets its memory beside the analytic count; ``precision`` shows what low-precision
accumulation and autocast do to values and dtypes. Each returns plain rows; the CLI
renders them.
"""
