"""Model FLOPs per step, counted once from the real model, and the analytic transformer estimate.

`count_flops` runs one forward+backward (a closure the caller gives) under PyTorch's
`FlopCounterMode`, which adds up the FLOPs of the matmuls, convolutions and attention it sees,
and under a dispatch mode that counts every aten op dispatched: FLOPs say how much work a step
is, the op count how many pieces it is cut into. Their ratio — and the step time divided by
the op count — tell a compute-bound step from one where per-op overhead dominates.

Units: FLOPs are floating-point operations (a multiply-add counts 2), per call of `fn`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    FlopCounterMode,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)


@dataclass(frozen=True, slots=True)
class FlopCount:
    """What one call of the measured closure did.

    `flops`: floating-point operations counted by `FlopCounterMode` (matmul, conv, attention;
    elementwise ops are not counted, as in the MFU convention). `ops`: aten operators
    dispatched, views and in-place updates included — each costs dispatcher time on the host
    and most launch a kernel on a GPU. `activation_bytes`: bytes of tensors saved for
    backward, parameters excluded and shared storage counted once (0 when not measured).
    `block_bytes`: of those, the bytes saved while each block given to `count_flops` ran its
    forward (what checkpointing that block would free), by the block's name; `input_bytes`,
    the bytes of the tensors each block was called with (what a checkpointed block still
    keeps, to recompute from); `head_bytes`, those saved after the last block's forward (the
    final norm, the logits, the loss), which backward frees before it recomputes a block.
    """

    flops: float
    ops: int
    activation_bytes: int = 0
    block_bytes: dict[str, int] = field(default_factory=dict)
    input_bytes: dict[str, int] = field(default_factory=dict)
    head_bytes: int = 0

    @property
    def flops_per_op(self) -> float:
        return self.flops / self.ops if self.ops else 0.0


class _OpCounter(TorchDispatchMode):
    """Counts every aten op that reaches the dispatcher (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


class _SavedBytes:
    """Adds up the storage of tensors autograd saves for backward, each storage once.

    Each saved tensor is handed to autograd in a box that `release()` empties. A hook that
    gave autograd the tensor itself would tie an op's saved output to the graph node that made
    it (node → tensor → grad_fn → node), a cycle through C++ that Python's collector cannot
    see: when the step fails before its backward (out of memory), the whole forward's
    activations would stay allocated for the rest of the process."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}
        self.by_block: dict[str, dict[int, int]] = {}
        self.inputs: dict[str, int] = {}  # bytes of the tensors each block was called with
        self.running: list[str] = []  # the blocks whose forward is running, outermost first
        self.head: dict[int, int] = {}  # saved after the last block's forward: the head's
        self._blocks_ran = False
        self._boxes: list[list[torch.Tensor]] = []

    def pack(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        base = tensor._base if tensor._base is not None else tensor
        # A parameter (or a view of one, like the transposed weight a Linear saves) is held
        # by the model anyway, and a copy of one (autocast's bf16 weight) is as large at any
        # micro-batch: neither is activation memory, which grows with the samples.
        if not (base.is_leaf and base.requires_grad) and not parameter_copy(base):
            storage = tensor.untyped_storage()
            self.storages[storage.data_ptr()] = storage.nbytes()
            for name in self.running:
                self.by_block.setdefault(name, {})[storage.data_ptr()] = storage.nbytes()
            if self._blocks_ran and not self.running:
                self.head[storage.data_ptr()] = storage.nbytes()
        box = [tensor]
        self._boxes.append(box)
        return box

    @staticmethod
    def unpack(box: list[torch.Tensor]) -> torch.Tensor:
        return box[0]

    def release(self) -> None:
        """Drop every saved tensor: after a step that failed. A count of a forward alone keeps
        them for the backward its caller runs next (and counts apart), which frees them."""
        for box in self._boxes:
            box.clear()
        self._boxes.clear()

    @property
    def total(self) -> int:
        return sum(self.storages.values())

    def block_totals(self) -> dict[str, int]:
        return {name: sum(storages.values()) for name, storages in self.by_block.items()}

    @contextmanager
    def attributing(self, blocks: Mapping[str, torch.nn.Module]) -> Iterator[None]:
        """Within: what is saved while a block of `blocks` runs its forward counts for it."""

        def enter(name: str) -> Callable[..., None]:
            def hook(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
                self.running.append(name)
                self.head.clear()  # what ran between blocks is not after the last
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                self.inputs[name] = self.inputs.get(name, 0) + sum(
                    t.numel() * t.element_size() for t in tensors
                )

            return hook

        def leave(name: str) -> Callable[..., None]:
            def hook(*_: Any) -> None:
                self.running.remove(name)
                self._blocks_ran = True

            return hook

        handles = []
        for name, module in blocks.items():
            handles.append(module.register_forward_pre_hook(enter(name)))
            handles.append(module.register_forward_hook(leave(name), always_call=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            self.running.clear()


# Autograd nodes that only change a tensor's dtype or shape: a chain of them from a parameter
# makes a copy of the parameter, whatever the batch.
_COPY_NODES = frozenset(
    {
        "ToCopyBackward0",
        "TBackward0",
        "TransposeBackward0",
        "ViewBackward0",
        "ReshapeAliasBackward0",
        "PermuteBackward0",
        "ExpandBackward0",
        "UnsqueezeBackward0",
        "AliasBackward0",
    }
)


def parameter_copy(tensor: torch.Tensor) -> bool:
    """Whether `tensor` was made from one parameter by casts and reshapes alone: autocast's
    bf16 copy of a weight, which a Linear saves for its backward at every micro-batch size."""
    node = tensor.grad_fn
    while node is not None and type(node).__name__ in _COPY_NODES:
        inputs = [fn for fn, _ in node.next_functions if fn is not None]
        if len(inputs) != 1:
            return False
        node = inputs[0]
        if type(node).__name__ == "AccumulateGrad":
            return True
    return False


def _cpu_attention_flops(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
    return int(sdpa_flop_count(query, key, value))


def _cpu_attention_backward_flops(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any
) -> int:
    return int(sdpa_backward_flop_count(grad_out, query, key, value))


def _extra_formulas() -> dict[Any, Any]:
    """FLOP formulas FlopCounterMode lacks: the CPU flash-attention kernels behind
    `scaled_dot_product_attention` (same arithmetic as the CUDA ones it does count)."""
    aten = torch.ops.aten
    extra: dict[Any, Any] = {}
    # Feature-detected: the op names are private to PyTorch and may move.
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        extra[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_attention_flops
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        extra[aten._scaled_dot_product_flash_attention_for_cpu_backward] = (
            _cpu_attention_backward_flops
        )
    return extra


def count_flops(
    fn: Callable[[], Any], blocks: Mapping[str, torch.nn.Module] | None = None
) -> FlopCount:
    """Run `fn` once — one micro-batch forward and backward — and count what it did, with the
    activation bytes each of `blocks` (named modules of the model) holds.

    `fn` runs for real: gradients it computes accumulate in the model, so zero them afterwards
    if the count is taken inside a training run. Tensors saved by activation-checkpointed
    blocks are recomputed in backward, not stored, and are not counted in `activation_bytes`.
    """
    saved = _SavedBytes()
    counter = _OpCounter()
    flop_mode = FlopCounterMode(display=False, custom_mapping=_extra_formulas())
    try:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            with saved.attributing(blocks or {}), flop_mode, counter:
                fn()
    except BaseException as exc:
        saved.release()  # a forward whose backward will never run: free what it saved
        from thrifty.levers.micro_batch import is_out_of_memory

        if is_out_of_memory(exc) and not isinstance(exc, torch.OutOfMemoryError):
            # The CPU allocator's RuntimeError: callers size the micro-batch on one type.
            raise torch.OutOfMemoryError(str(exc)) from exc
        raise
    return FlopCount(
        float(flop_mode.get_total_flops()),
        counter.ops,
        saved.total,
        saved.block_totals(),
        saved.inputs,
        sum(saved.head.values()),
    )


def transformer_flops_per_token(
    n_params_non_embedding: float, n_layer: int, hidden: int, seq_len: int
) -> float:
    """Training FLOPs per token of a decoder transformer: 6·N + 12·L·H·T.

    6·N: forward (2 FLOPs per parameter per token: a multiply-add) plus backward (twice the
    forward). 12·L·H·T: attention scores and the weighted sum of values, 2·2·H·T per token and
    layer forward, ×3 with backward (H = heads × head dimension, T = sequence length). N counts
    the weights every token multiplies — all parameters but the embedding tables (an output
    projection that is not tied to the embedding belongs to N). Same estimate as nanoGPT's
    `estimate_mfu` and torchtitan's `get_dense_model_nparams_and_flops`; full causal scores
    are counted, as kernels compute them.

    Returns FLOPs per token for one forward+backward; multiply by tokens per second for the
    achieved FLOP/s.
    """
    if min(n_params_non_embedding, n_layer, hidden, seq_len) <= 0:
        raise ValueError(
            "transformer_flops_per_token needs positive n_params_non_embedding, n_layer, hidden "
            f"and seq_len, got {n_params_non_embedding}, {n_layer}, {hidden}, {seq_len}"
        )
    return 6.0 * n_params_non_embedding + 12.0 * n_layer * hidden * seq_len


def mfu(flops_per_step: float, step_seconds: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilization: achieved FLOP/s (FLOPs per step ÷ seconds per step) ÷ peak."""
    if step_seconds <= 0 or peak_flops_per_second <= 0:
        raise ValueError(
            f"mfu needs positive step_seconds and peak, got {step_seconds} and "
            f"{peak_flops_per_second}"
        )
    return flops_per_step / step_seconds / peak_flops_per_second
