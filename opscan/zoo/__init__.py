"""The zoo: a leaderboard of whole models across every release the knowledge base holds (issue 19, `opscan zoo`).

releases.py turns one model's step into a verdict and lane per release (ReleaseResult). models.py is the unit of
work (ZooModel) and the manifest; families.py the shipped families (their targets in factories.py); task.py what
a worker runs for one model; pool.py (the default, local processes) and ray_run.py (`--ray`) run the tasks;
journal.py reads the journal a rerun resumes from; board.py is the Leaderboard; outputs.py (JSON, CSV, diff)
and html.py render it, as pure functions. The CLI (opscan/cli/zoo.py) writes the files.
"""
