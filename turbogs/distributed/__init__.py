"""Several ranks: the process group and its collectives (world.py), the --nproc launcher
(launch.py), and a step of several views summed over the ranks (multiview.py)."""
