"""Optimizers: the base and Adam (base.py), the hybrid Hessian-informed/Adam optimizer
(hybrid.py) with its one-op-per-stage step (hybrid_step.py) and curvature estimate (curvature.py)."""
