"""Which sample, in which order, drawing which random numbers: the per-epoch order of a
map-style dataset, computed on the fly from (seed, epoch) so no rank ever holds the epoch's
shuffle (a list of 240 M indices is about 9 GB), and the per-batch seeding that makes a batch
draw the same random numbers with 0 or 8 workers, resumed or not, for the global generators the
dataset's fetches draw from (found by probing it) and only those.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import sys
from collections.abc import Iterable, Iterator, Sized
from typing import Any, cast

import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

log = logging.getLogger("thrifty")

# --- which sample, and the random numbers it draws ----------------------------------------------


# A sample to fetch: (dataset index, epoch, position in the epoch's order over all ranks). The
# position does not depend on the rank count. A loader hands `SeededSamples` whole batches
# (`KeyedBatch`), each keyed by its first sample; a plain tuple keys a sample fetched alone.
SampleKey = tuple[int, int, int]


_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    # splitmix64's finaliser: each input bit flips about half of the output bits.
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """The 64-bit seed of the sample at `position` (counted over all ranks) of epoch `epoch`."""
    return _mix(_mix(_mix(seed & _MASK64) ^ epoch) ^ position)


# The process-wide generators a fetch can draw from without being handed one: torch's CPU
# default generator, Python's `random`, and NumPy's legacy global generator. Saving and
# restoring one costs, on a 2-core CPU: torch 1.5 µs, `random` 11 µs, NumPy about 90 µs;
# seeding one 1-4 µs.
GENERATORS = ("torch", "random", "numpy")

PROBE_SAMPLES = 64  # samples `probe_draws` fetches, spread over the dataset
PROBE_CALLS = 4  # in this many fetches: a dataset with batched reads may draw once a call
CHECK_EVERY = 64  # main-process fetches between checks for a draw the probe did not see


def _numpy() -> Any:
    return sys.modules.get("numpy")  # a dataset that uses NumPy has imported it


def _present(names: Iterable[str]) -> tuple[str, ...]:
    """`names`, less NumPy while it is not imported."""
    return tuple(n for n in names if n != "numpy" or "numpy" in sys.modules)


def generator_states(names: Iterable[str] = GENERATORS) -> dict[str, Any]:
    """The states of the generators `names` (NumPy's only once imported)."""
    states: dict[str, Any] = {}
    for name in _present(names):
        if name == "torch":
            states[name] = torch.default_generator.get_state()
        elif name == "random":
            states[name] = random.getstate()
        else:
            states[name] = _numpy().random.get_state()
    return states


def set_generator_states(states: dict[str, Any]) -> None:
    """Put back what `generator_states` returned."""
    for name, state in states.items():
        if name == "torch":
            torch.default_generator.set_state(state)
        elif name == "random":
            random.setstate(state)
        else:
            _numpy().random.set_state(state)


def _changed(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    """The generators whose state differs (one imported in between counts as changed)."""
    out = set()
    for name, state in after.items():
        old = before.get(name)
        if old is None:
            out.add(name)
        elif name == "torch":
            if not torch.equal(old, state):
                out.add(name)
        elif name == "random":
            if old != state:
                out.add(name)
        elif old[0] != state[0] or old[2:] != state[2:] or (old[1] != state[1]).any():
            out.add(name)  # NumPy's legacy state: (kind, keys, pos, has_gauss, cached)
    return out


def seed_generators(seed: int, names: Iterable[str] = GENERATORS) -> None:
    """Seed the generators `names`: torch's CPU generator, `random`, NumPy's global generator
    (when imported)."""
    for name in names:
        if name == "torch":
            torch.default_generator.manual_seed(seed)  # torch.manual_seed reseeds CUDA, slowly
        elif name == "random":
            random.seed(seed)
        else:
            np = _numpy()
            if np is not None:
                np.random.seed(seed >> 32)  # the legacy generator takes 32 bits


_KEPT: list[tuple[str, ...]] = []  # the generators each open `training_rng_kept` scope keeps


@contextlib.contextmanager
def training_rng_kept(names: Iterable[str] = GENERATORS) -> Iterator[None]:
    """In the main process (0 workers), leave the training's random streams (dropout) of the
    generators `names` as if no sample had been fetched; a worker's generators are its own.
    Fetches inside an open scope save and restore only what it does not keep already: the
    training loop opens one per accumulation window, so states are copied once a step, not
    once a micro-batch, and only those of the generators the dataset draws from."""
    if get_worker_info() is not None:
        yield
        return
    kept = {n for scope in _KEPT for n in scope}
    wanted = tuple(n for n in names if n not in kept)
    if not wanted:
        yield
        return
    saved = generator_states(wanted)
    _KEPT.append(wanted)
    try:
        yield
    finally:
        _KEPT.pop()
        set_generator_states(saved)


def draws_no_random_numbers(dataset: Dataset) -> bool:
    """Whether fetching from `dataset` is known to draw no random numbers (a TensorDataset, or
    a Subset of one): its batches need no seeding and the training's streams no guard."""
    from torch.utils.data import Subset, TensorDataset

    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return type(dataset) is TensorDataset


def _fetch(dataset: Any, indices: list[int]) -> list[Any]:
    batched = getattr(dataset, "__getitems__", None)  # batched reads stay batched
    if batched is not None:
        return list(batched(indices))
    return [dataset[i] for i in indices]


def _first_numbers() -> dict[str, float]:
    """Each generator's next number (which draws it)."""
    out = {"torch": float(torch.rand((), dtype=torch.float64)), "random": random.random()}
    np = _numpy()
    if np is not None:
        out["numpy"] = float(np.random.random_sample())
    return out


def probe_draws(dataset: Dataset, seed: int = 0, samples: int = PROBE_SAMPLES) -> tuple[str, ...]:
    """The global generators (of `GENERATORS`) that fetching `dataset` draws from, or whose
    state it sets: `samples` samples spread evenly over it are fetched in `PROBE_CALLS`
    fetches, each with every generator seeded from (`seed`, its position); a generator whose
    next number is not then the seed's first was used.

    The answer depends only on the dataset and `seed`, never on timing or on where a run
    starts, so a resumed run finds what the uninterrupted one found. Every generator is left
    as it was: the probe shifts no training stream.
    """
    n = len(cast(Sized, dataset))
    count = min(n, samples)
    if count == 0:
        return ()
    indices = [k * n // count for k in range(count)]
    per_call = -(-count // PROBE_CALLS)
    used: set[str] = set()
    with training_rng_kept():
        for start in range(0, count, per_call):
            batch_seed = sample_seed(seed, 0, start)
            seed_generators(batch_seed)
            expected = _first_numbers()
            seed_generators(batch_seed)
            _fetch(dataset, indices[start : start + per_call])
            got = _first_numbers()
            used.update(name for name, x in got.items() if expected.get(name) != x)
    return tuple(name for name in GENERATORS if name in used)


# The probe's lines said in this process: each loader (the workers' measurement, the training's,
# the evaluation's) wraps the dataset anew and probes it, and the answer is the same each time.
_SAID: set[str] = set()


def _say_once(line: str) -> None:
    if line not in _SAID:
        _SAID.add(line)
        log.info("%s", line)


class SeededSamples(Dataset):
    """`dataset`, fetched a `KeyedBatch` (or a list of `SampleKey`s) at a time: each batch is
    fetched with the generators it draws from seeded by `sample_seed(seed, epoch, position)` of its first
    sample, so it draws the same numbers whichever worker fetches it and wherever its epoch
    resumed (a resumed epoch starts on a batch boundary). Once per batch, not per sample:
    reseeding all three costs about 7 µs. Plain indices pass through unseeded.

    In a worker every generator is seeded (worker time, not the training loop's). In the main
    process only those `probe_draws` found are seeded, and kept for the training: a dataset
    that draws none is fetched as it is. Every `CHECK_EVERY`-th fetch there checks that the
    others stay untouched, and a draw the probe did not see is logged once per generator: it
    is left unseeded (as the run began, whether resumed or not), so a run resumed with the
    same worker count stays bit-exact, one with another count does not.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self._drawn: tuple[str, ...] | None = None
        self._fetches = 0
        self._said: set[str] = set()

    def __len__(self) -> int:
        return len(cast(Sized, self.dataset))  # map-style: torch's Dataset type omits __len__

    def __getitem__(self, key: SampleKey | int) -> Any:
        return self.__getitems__([key])[0]

    def draws_from(self) -> tuple[str, ...]:
        """The generators the main process seeds and keeps for each batch (probed once)."""
        if self._drawn is None:
            self._drawn = probe_draws(self.dataset, self.seed)
            _say_once(
                f"data: {type(self.dataset).__name__} draws from "
                f"{', '.join(self._drawn) or 'no global random generator'} "
                f"({min(len(self), PROBE_SAMPLES)} samples probed)"
                f"{': its batches are fetched unseeded' if not self._drawn else ''}"
            )
        return self._drawn

    def __getitems__(self, keys: list[Any]) -> list[Any]:
        """The samples of a `KeyedBatch`, of `SampleKey`s, or of plain indices (unseeded)."""
        key: tuple[int, int] | None = None  # what seeds the batch: (epoch, position)
        indices: list[int] = keys
        if isinstance(keys, KeyedBatch):
            key = (keys.epoch, keys.position)
        elif isinstance(keys[0], tuple):
            key = keys[0][1], keys[0][2]
            indices = [k[0] for k in keys]
        if get_worker_info() is not None:
            if key is not None:  # a worker's generators are its own: seed them all
                seed_generators(sample_seed(self.seed, *key))
            return _fetch(self.dataset, indices)
        drawn = self.draws_from()
        self._fetches += 1
        if self._fetches % CHECK_EVERY == 0:
            return self._checked(key, indices, drawn)
        return self._seeded(key, indices, drawn)

    def _seeded(
        self, key: tuple[int, int] | None, indices: list[int], drawn: tuple[str, ...]
    ) -> list[Any]:
        if not drawn:
            return _fetch(self.dataset, indices)  # nothing to seed, nothing to keep
        with training_rng_kept(drawn):
            if key is not None:
                seed_generators(sample_seed(self.seed, *key), drawn)
            return _fetch(self.dataset, indices)

    def _checked(
        self, key: tuple[int, int] | None, indices: list[int], drawn: tuple[str, ...]
    ) -> list[Any]:
        """A fetch that also checks the generators the probe found unused stay so."""
        others = tuple(n for n in GENERATORS if n not in drawn)
        before = generator_states(others)
        batch = self._seeded(key, indices, drawn)
        for name in sorted(_changed(before, generator_states(others)) - self._said):
            self._said.add(name)
            log.warning(
                "data: %s drew from the %s generator at a fetch, though none of the %d samples "
                "probed at the start did: its draws there are not seeded per batch, so its "
                "batches depend on the worker count; a run resumed with the same "
                "data.num_workers stays bit-exact, one resumed with another does not. Set "
                "data.num_workers to a fixed count (with 1 or more, every batch is seeded in "
                "its worker)",
                type(self.dataset).__name__,
                name,
                min(len(self), PROBE_SAMPLES),
            )
        return batch


# --- the epoch order ----------------------------------------------------------------------------

# The algorithm of the epoch order, recorded in checkpoints: a run resumed under another order
# would see other samples. Change the name whenever `epoch_order` changes its output.
SHUFFLE = "feistel-1"

_ROUNDS = 6  # Luby-Rackoff: 4 already make a pseudo-random permutation; 6 spread small n evenly
_BLOCK = 16384  # positions computed per batch of tensor operations (128 KB tensors)
_MASK32 = 0xFFFFFFFF


def _round_keys(seed: int, epoch: int) -> list[int]:
    """The Feistel round keys of epoch `epoch`, 32 bits each. Apart from every `sample_seed`:
    where that mixes in a position, this mixes in bit 63, which no position has."""
    base = _mix(_mix(_mix(seed & _MASK64) ^ epoch) ^ (1 << 63))
    return [_mix(base ^ r) & _MASK32 for r in range(_ROUNDS)]


def _feistel(x: torch.Tensor, a: int, b: int, keys: list[int]) -> torch.Tensor:
    """A bijection of [0, a × b) (a, b <= 2**31): Feistel rounds on x = left × b + right with
    modular addition, left in [0, a) and right in [0, b), the two ranges swapping each round.
    Every product stays below 2**63: int64 never overflows."""
    left, right = x // b, x % b
    for key in keys:
        h = ((right ^ key) * 0x21F0AAAD) & _MASK32  # a 32-bit hash of right (lowbias32's shape)
        h = ((h ^ (h >> 16)) * 0x735A2D97) & _MASK32
        s = left + ((h * a) >> 32)  # plus the hash scaled to [0, a)
        left, right = right, torch.where(s >= a, s - a, s)
        a, b = b, a
    return left * b + right


def epoch_order(positions: torch.Tensor, length: int, seed: int, epoch: int) -> torch.Tensor:
    """The dataset indices at `positions` (int64, each in [0, length)) of epoch `epoch`'s
    shuffled order of `length` samples (at most 2**62).

    The order is a keyed bijection computed on the fly, so a rank holds no permutation (a list
    of 240 M indices is about 9 GB) and starts anywhere in it for free. It is a Feistel network
    on [0, a × b), a = ceil(sqrt(length)), b = ceil(length / a), re-applied to a value until it
    falls below `length` (cycle-walking). The even-bit power of two a balanced network needs
    can hold up to 4 × `length` values, and so up to 4 passes a position on average; this
    domain holds fewer than `length` + a, so all but about 1 in sqrt(`length`) take one pass.
    """
    n = max(length, 1)
    a = math.isqrt(n - 1) + 1
    b = -(-n // a)
    keys = _round_keys(seed, epoch)
    out = _feistel(positions, a, b, keys)
    outside = out >= length
    while bool(outside.any()):
        out[outside] = _feistel(out[outside], a, b, keys)
        outside = out >= length
    return out


class EpochSampler(Sampler[int]):
    """Indices of one epoch: an order seeded by (seed, epoch) (`epoch_order`), this rank's
    share of it, starting `start` samples in, so a resumed run skips straight to where it was
    instead of replaying the epoch. Rank r gets positions r, r + W, r + 2W, ... of the order
    over its first (length // W) × W positions: equal shares, so no rank waits on another."""

    def __init__(
        self,
        length: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.length = length
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Iterate epoch `epoch` from this rank's sample `start` on."""
        self.epoch = epoch
        self.start = start

    def position(self, k: int) -> int:
        """The position over all ranks of this rank's `k`-th sample of an epoch."""
        return self.rank + k * self.world_size

    def _blocks(self, epoch: int, start: int) -> Iterator[list[int]]:
        """The indices of this rank's samples from `start` on, a block at a time."""
        per_rank = self.length // self.world_size
        for first in range(start, per_rank, _BLOCK):
            k = torch.arange(first, min(first + _BLOCK, per_rank), dtype=torch.int64)
            positions = self.rank + k * self.world_size
            indices = positions
            if self.shuffle:
                indices = epoch_order(positions, self.length, self.seed, epoch)
            yield indices.tolist()

    def __iter__(self) -> Iterator[int]:
        # The epoch and start are read now, as the iterator is made, not at its first sample.
        return (i for indices in self._blocks(self.epoch, self.start) for i in indices)

    def keys(self) -> Iterator[SampleKey]:
        """The same samples as iterating, each with its epoch and position (what seeds it)."""
        epoch, start, world = self.epoch, self.start, self.world_size
        positions = range(self.position(start), self.position(len(self) + start), world)
        indices = (i for block in self._blocks(epoch, start) for i in block)
        return ((i, epoch, p) for i, p in zip(indices, positions, strict=True))

    def __len__(self) -> int:
        return self.length // self.world_size - self.start


def _keyed_batch(indices: list[int], epoch: int, position: int) -> KeyedBatch:
    batch = KeyedBatch(indices)
    batch.epoch, batch.position = epoch, position
    return batch


class KeyedBatch(list[int]):
    """A batch's dataset indices, with the epoch and the position (over all ranks) of its first
    sample: what seeds the batch. One object per batch goes to a worker, not one per sample."""

    __slots__ = ("epoch", "position")
    epoch: int
    position: int

    def __reduce__(self) -> tuple[Any, ...]:
        return _keyed_batch, (list(self), self.epoch, self.position)


class EpochBatches(Sampler[KeyedBatch]):
    """An EpochSampler's samples in batches of `batch_size`, the last partial batch dropped,
    for a loader's `batch_sampler`: sliced from the order a block at a time, with no Python
    object per sample (6 µs a batch of 64, where batching per-sample keys took 14 µs)."""

    def __init__(self, sampler: EpochSampler, batch_size: int) -> None:
        self.sampler = sampler
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[KeyedBatch]:
        s = self.sampler
        epoch, k = s.epoch, s.start  # read now, as the iterator is made
        return self._batches(s._blocks(epoch, k), epoch, k)

    def _batches(self, blocks: Iterator[list[int]], epoch: int, k: int) -> Iterator[KeyedBatch]:
        size, rest = self.batch_size, cast(list[int], [])
        for block in blocks:
            indices = rest + block if rest else block
            whole = len(indices) - len(indices) % size
            for i in range(0, whole, size):
                yield _keyed_batch(indices[i : i + size], epoch, self.sampler.position(k))
                k += size
            rest = indices[whole:]

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size
