"""The plan of kills: which step each SIGKILL aims at, and whether at a save or inside a step."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from thrifty.errors import ThriftyError


@dataclass
class Kill:
    """One planned kill, then what happened."""

    number: int
    kind: str  # "step" or "save"
    target: int  # the step it aims at (for a save: the step being saved)
    moment: float | None = None  # seconds after its attempt started
    reached: int | None = None  # the last step the killed attempt logged
    resumed: int | None = None  # the step the next attempt resumed from (None: started over)
    steps_lost: int | None = None
    torn_saves: list[int] = field(default_factory=list)  # saves cut short: no manifest
    cut_deletions: list[int] = field(default_factory=list)  # old checkpoints half deleted

    def set_resumed(self, resumed: int | None) -> None:
        """The step the attempt after this kill resumed from, and so the steps it lost."""
        self.resumed = resumed
        if self.reached is not None:
            self.steps_lost = self.reached - (resumed or 0)


def plan_kills(kills: int, every: int, last_step: int, seed: int) -> list[Kill]:
    """K kills over steps every+1 .. last_step-1, one per equal span; half of them at saves."""
    lo, hi = every + 1, last_step - 1
    if hi - lo + 1 < kills:
        raise ThriftyError(
            f"the reference run did {last_step} steps: too few for {kills} kills after the first "
            f"checkpoint at step {every}; give more --steps or a smaller --every"
        )
    rng = random.Random(seed)
    kinds = ["save"] * math.ceil(kills / 2) + ["step"] * (kills // 2)
    rng.shuffle(kinds)
    span = hi - lo + 1
    plan = []
    for i, kind in enumerate(kinds):
        a, b = lo + span * i // kills, lo + span * (i + 1) // kills - 1
        saves = [s for s in range(a, b + 1) if s % every == 0]
        if kind == "save" and saves:
            plan.append(Kill(i + 1, "save", rng.choice(saves)))
        else:
            plan.append(Kill(i + 1, "step", rng.randint(a, b)))
    return plan
