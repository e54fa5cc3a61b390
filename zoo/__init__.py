"""The zoo: interpretable models written in penrose, with offline data, training and metrics."""
