"""The credit gym: small synthetic multi-reward tasks whose relevant tokens are known, a tiny policy
warm-started on a noisy demonstrator, and runs of hundreds of RL steps through the same
``MRTPOTrainer``, replay and credit code that real runs use.

Families (registered tasks): ``gym-constraints`` (instruction-following shape), ``gym-answer``
(SQL shape, privileged gold answer), ``gym-call`` (tool shape), ``gym-overlap`` (the control,
rewards that overlap fully), ``gym-tradeoff`` and ``gym-long`` (long high-entropy filler). See :mod:`mrtpo.gym.task`.
"""
