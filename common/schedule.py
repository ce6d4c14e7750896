"""The learning-rate schedule of pretraining and fine-tuning (the BERT recipe): linear warm-up,
then linear decay to zero at the run's last step. Plain Python, so that the model card
(`model/model_card.py`) says the learning rate the run's scheduler (`training/optim.py`
build_scheduler) used, without importing torch."""

from __future__ import annotations

from collections.abc import Callable


def warmup_linear_decay(warmup_steps: int, max_steps: int) -> Callable[[int], float]:
    """lr multiplier of the step after `step` steps are done (LambdaLR's argument): (s+1)/warmup
    during warmup, then linear to 0 at max_steps."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, max_steps - warmup_steps)
        return max(0.0, (max_steps - step) / span)

    return factor
