"""The zoo: a leaderboard of whole models across every release the knowledge base holds (issue 19).

releases.py turns one model's step into a verdict and lane per release (ReleaseResult); the rest of the package
(families, manifest, runner, outputs) builds on it.
"""
