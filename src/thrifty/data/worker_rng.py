"""Each loader worker's random state, saved and restored with a StatefulDataLoader's state.

StatefulDataLoader restores the order and each worker's base seed, and so restarts every
worker's generators from that seed rather than from where they were: a resumed run's random
crops and flips would differ. So each worker of a StatefulDataLoader also saves its generators
(torch, `random`, NumPy) with its state after every batch, and restores them
(`keep_worker_rng`). A loader with state whose workers' random state cannot be kept, fetching
samples that draw random numbers, is said as the run starts (`random_line`).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, get_worker_info

from thrifty.data.kinds import is_stream, length, stateful, stateful_loader_class
from thrifty.data.sampling import draws_no_random_numbers, probe_draws

_RNG = "thrifty_worker_rng"  # the key of a worker's generators in its dataset's state


def _worker_rng() -> dict[str, Any]:
    """This process's torch CPU, `random` and NumPy generators, as tensors and plain values
    (a checkpoint is loaded with weights_only=True): about 60 µs and 16 KB, once a batch."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    np = sys.modules.get("numpy")  # loader workers seed it whenever it is installed
    # 625 ints: through NumPy in a tenth of torch.tensor's 130 µs.
    words = torch.tensor(internal) if np is None else torch.from_numpy(np.array(internal, np.int64))
    state["python"] = {"version": version, "state": words, "gauss": gauss}
    if np is not None:
        _, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        }
    return state


def _set_worker_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss"]))
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in state:
        n = state["numpy"]
        keys = n["keys"].numpy().astype(np.uint32)
        np.random.set_state(("MT19937", keys, n["pos"], n["has_gauss"], n["cached"]))


class KeepWorkerRng:
    """A StatefulDataLoader's `worker_init_fn`: runs the loader's own (`then`), then gives this
    worker's copy of the dataset a state that holds the worker's generators beside the
    dataset's own state, if any. The loader takes that state after each batch the worker
    fetches and hands it back to the worker that continues it, after its seeding and this
    function: the resumed worker draws what it would have drawn. A class, not a closure, so it
    pickles for the spawn and forkserver start methods."""

    def __init__(self, then: Callable[[int], None] | None) -> None:
        self.then = then

    def __call__(self, worker_id: int) -> None:
        if self.then is not None:
            self.then(worker_id)
        info = get_worker_info()
        if info is None:
            return
        data: Any = info.dataset
        own = (data.state_dict, data.load_state_dict) if stateful(data) else None

        def state_dict() -> dict[str, Any]:
            return {_RNG: _worker_rng(), "dataset": own[0]() if own else None}

        def load_state_dict(state: Any) -> None:
            if not (isinstance(state, dict) and _RNG in state):
                if own:  # saved without the generators
                    own[1](state)
                return
            if own and state["dataset"] is not None:
                own[1](state["dataset"])
            _set_worker_rng(state[_RNG])

        # On this worker's copy only; the loader finds the state through these attributes.
        data.state_dict, data.load_state_dict = state_dict, load_state_dict


def keep_worker_rng(loader: DataLoader) -> str | None:
    """Make the workers of `loader` save and restore their generators with its state (see
    `KeepWorkerRng`). None when they do, or when its samples draw no random numbers; else why
    a resumed run's workers will draw other numbers."""
    stateful_class = stateful_loader_class()
    data = loader.dataset
    if stateful_class is None or not isinstance(loader, stateful_class):
        why = "only torchdata's StatefulDataLoader saves what each worker holds"
    elif not getattr(loader, "in_order", True):
        why = "with in_order=False StatefulDataLoader does not track what each worker holds"
    elif not getattr(loader, "snapshot_every_n_steps", 1):
        why = "with snapshot_every_n_steps=0 StatefulDataLoader saves no worker state"
    elif not hasattr(data, "__dict__"):
        why = "its dataset takes no attributes (__slots__) to carry them"
    else:
        if not isinstance(loader.worker_init_fn, KeepWorkerRng):
            loader.worker_init_fn = KeepWorkerRng(loader.worker_init_fn)
        return None
    return why if draws_random_numbers(data) else None


def draws_random_numbers(data: Any) -> bool:
    """Whether fetching from `data` draws from torch's, Python's or NumPy's global generator
    (`probe_draws`: a few fetches, once, as the run starts; the training's generators are left
    as they were). A stream, or a dataset the probe cannot fetch from, may."""
    if draws_no_random_numbers(data):
        return False
    if is_stream(data) or length(data) is None:
        return True
    try:
        return bool(probe_draws(data))
    except Exception:
        return True


def random_line(loader: DataLoader, note: str) -> str:
    """The line a run starts with when its loader's workers draw numbers no checkpoint keeps
    (`note`: why)."""
    workers = loader.num_workers
    what = f"{type(loader).__name__} over {type(loader.dataset).__name__}"
    return (
        f"train_data ({what}) draws random numbers in {workers} loader workers whose random "
        f"state cannot be saved ({note}): a resumed run restores the order, but "
        "its augmentation draws other numbers than an uninterrupted run would; pass the "
        "dataset itself as train_data (thrifty seeds each batch from its position), set "
        "num_workers=0, or seed the augmentation from the sample's index"
    )
