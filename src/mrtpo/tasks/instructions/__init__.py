"""Multi-constraint instruction following: IFEval/IFBench checkers, data, prompts, rewards.

Importing this package registers the ``instructions`` task (see :mod:`.task`). Modules:
``checkers`` (offline adapter over if-verifiable), ``nltk_data`` (project-local NLTK data),
``data`` (IFEval/IFBench files), ``pools`` (training classes, exclusions, conflicts),
``generate`` (training prompts), ``verifiers`` (the 5 slot rewards), ``evaluate`` (scoring).
"""

from mrtpo.tasks.instructions.task import SPLITS, InstructionsTask

__all__ = ["InstructionsTask", "SPLITS"]
