"""Slurm as the cluster engine: read a ClusterSnapshot from Slurm's JSON (snapshot.py, jsonfmt.py,
gres.py, meta.py), run its commands (commands.py), carry decisions out on held jobs (apply.py).
The runner backend that launches jobs through sbatch is runners/slurm.py."""
