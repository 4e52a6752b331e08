"""Training: the loop, a whole run, and what a run needs around it (config, views, clock,
checkpoints, the output folder, the memory check)."""
