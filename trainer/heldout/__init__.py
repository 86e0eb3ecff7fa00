"""A run's held-out evaluation: `scoring.py` rolls a policy out on held-out questions and scores
it (`eval/*`, each question's scores); `points.py` runs it at the run's points (before RL, every
`run.eval_every` steps, after; validation points) through a narrow view of the run."""
