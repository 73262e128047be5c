"""Reports a person reads: token-credit views (HTML) and reward curves."""
