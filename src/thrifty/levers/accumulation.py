"""What the Trainer needs to know about a batch: how to move it, call the model on it, find the
loss in the output, and weigh it inside an accumulation window.

Calling convention: a dict batch is passed as keyword arguments (`model(**batch)`); a tuple or
list as positional arguments, all of them without `loss_fn` and all but the last (the target)
with one; anything else as the single argument. The loss is the output itself, its `.loss` or
`["loss"]`, or the one scalar of a tuple (nanoGPT's and minGPT's `(logits, loss)`). A batch the
model's forward cannot take, or a loss_fn that fails on the output, is one line naming the fix,
not the error of its call.

Weighting (`Weighting`): each micro-batch's mean loss counts by its share of the window's
samples, or of its loss tokens (a `loss_mask`, or per-token `labels` that are not -100, shifted
by one for a causal LM), so the accumulated gradient is the full batch's.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from thrifty.errors import ThriftyError

LossFn = Callable[[Any, Any], torch.Tensor]


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor of a (nested) batch to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking) for v in batch)
    return batch


def _first_tensor(
    batch: Any, accept: Callable[[torch.Tensor], bool] = lambda t: True
) -> torch.Tensor | None:
    """The first tensor of a (nested) batch that `accept` takes, in order."""
    if isinstance(batch, torch.Tensor):
        return batch if accept(batch) else None
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, (list, tuple)) or isinstance(batch, Mapping):
        for v in values:
            found = _first_tensor(v, accept)
            if found is not None:
                return found
    return None


def count_samples(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor."""
    tensor = _first_tensor(batch)
    return int(tensor.shape[0]) if tensor is not None and tensor.dim() > 0 else 1


def count_tokens(batch: Any) -> int:
    """Tokens a batch trains on, for run.max_tokens and tokens/s: the `loss_mask` sum, else the
    real tokens of `input_ids` (its `attention_mask`'s ones: padding is no token), else its
    size, else the size of the batch's first tensor of token ids (a 2-D integer tensor, as in
    nanoGPT's `(x, y)`), else 0 (no tokens: float features, images)."""
    if isinstance(batch, Mapping):
        if "loss_mask" in batch:
            return int(batch["loss_mask"].sum())
        mask = batch.get("attention_mask")
        if isinstance(mask, torch.Tensor) and _is_padding_mask(mask) and "input_ids" in batch:
            return int(mask.sum())
        if "input_ids" in batch:
            return int(batch["input_ids"].numel())
    ids = _first_token_ids(batch)
    return 0 if ids is None else int(ids.numel())


def _first_token_ids(batch: Any) -> torch.Tensor | None:
    """The first tensor of token ids in a (nested) batch: int32 or int64, (samples, positions).
    A uint8 image or a 1-D class label is none."""
    return _first_tensor(batch, _is_token_ids)


def _is_token_ids(tensor: torch.Tensor) -> bool:
    return tensor.dim() == 2 and tensor.dtype in (torch.int32, torch.int64)


IGNORE_INDEX = -100  # the label PyTorch's cross_entropy and transformers' losses leave out


def token_labels(batch: Any) -> torch.Tensor | None:
    """A batch's per-token labels (transformers' convention: `labels` of integer ids, one row a
    sample, IGNORE_INDEX where no loss is taken), or None: 1-D labels are one per sample (a
    sequence classifier), where counting samples is already exact."""
    if not isinstance(batch, Mapping):
        return None
    labels = batch.get("labels")
    if isinstance(labels, torch.Tensor) and labels.dim() >= 2 and not labels.is_floating_point():
        return labels
    return None


def count_loss_tokens(batch: Any, shifted: bool = False) -> int:
    """The tokens a micro-batch's mean loss is averaged over: its `loss_mask` sum; else its
    labels that are not IGNORE_INDEX (`shift_labels` where given, else `labels` from the second
    position on where the model's loss shifts them: a causal LM predicts token t + 1 at t);
    else `count_tokens`. Counted on the host, before the batch moves to the device."""
    if isinstance(batch, Mapping) and "loss_mask" not in batch:
        given = batch.get("shift_labels")
        if isinstance(given, torch.Tensor):
            return int((given != IGNORE_INDEX).sum())
        labels = token_labels(batch)
        if labels is not None:
            targets = labels[..., 1:] if shifted else labels
            return int((targets != IGNORE_INDEX).sum())
    return count_tokens(batch)


def _is_padding_mask(mask: torch.Tensor) -> bool:
    """A Hugging Face padding mask: ones for tokens, zeros for padding, one row a sample (an
    additive float mask of 0 and -inf is not one)."""
    if mask.dim() != 2:
        return False
    return mask.dtype == torch.bool or not (mask.is_floating_point() or mask.is_complex())


def window_counts(window: Sequence[Any], shifted: bool = False) -> tuple[list[int], list[int]]:
    """Samples and loss tokens (`count_loss_tokens`) of each micro-batch of a window, counted
    on the host."""
    return [count_samples(b) for b in window], [count_loss_tokens(b, shifted) for b in window]


def _weighs_tokens(batch: Any) -> bool:
    return isinstance(batch, Mapping) and (
        "loss_mask" in batch or "shift_labels" in batch or token_labels(batch) is not None
    )


def uses_tokens(window: Sequence[Any], normalize: str) -> bool:
    """Whether the window's losses are weighted by tokens (else by samples): always with
    "tokens"; with "auto" where every micro-batch carries a loss_mask or per-token labels."""
    return normalize == "tokens" or (normalize == "auto" and all(map(_weighs_tokens, window)))


def is_causal_lm(model: nn.Module) -> bool:
    """Whether the model's own loss shifts its labels by one position: transformers' causal
    language models (`...ForCausalLM`, `...LMHeadModel`: GPT-2, Llama), not encoder-decoders
    (whose decoder inputs are shifted instead) nor masked LMs or classifiers."""
    inner = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    inner = getattr(inner, "module", inner)  # DDP's, FSDP's
    config = getattr(inner, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return False
    # The class and its bases (a subclass of LlamaForCausalLM, FSDP's FSDP<class>), and the
    # architectures a pretrained config names.
    classes = [c.__name__ for c in type(inner).__mro__]
    names = [*classes, *(getattr(config, "architectures", None) or [])]
    if getattr(inner, "loss_type", None) == "ForCausalLM":
        return True
    return any(str(n).endswith(("ForCausalLM", "LMHeadModel")) for n in names)


def loss_weights(
    window: Sequence[Any],
    normalize: str,
    counts: tuple[list[int], list[int]] | None = None,
    totals: Sequence[int] | None = None,
    world_size: int = 1,
) -> list[float]:
    """Weights that turn per-micro-batch mean losses into the mean over the whole window.

    Each micro-batch's loss is a mean over its own samples (or tokens); weighting it by its
    share of the window's samples (tokens) makes the accumulated gradient equal the gradient
    of one big batch, also when micro-batches hold uneven token counts. `counts` are
    `window_counts(window)` (samples, loss tokens) when the caller has them already.

    With several processes the window is every rank's micro-batches: `totals` are its samples
    and loss tokens over all ranks. Data parallelism averages the ranks' gradients (divides
    their sum by `world_size`), so each weight is the batch's share of the global window times
    `world_size`, and the averaged gradient is again that of one big batch.
    """
    use_tokens = uses_tokens(window, normalize)
    samples, tokens = counts or window_counts(window)
    counts_used = tokens if use_tokens else samples
    total: float
    if totals is None:
        total = sum(counts_used)
    else:
        total = (totals[1] if use_tokens else totals[0]) / world_size
    if total == 0:
        raise ThriftyError(
            "an accumulation window holds no tokens to learn from (every loss_mask is zero, or "
            f"every label is {IGNORE_INDEX}): check the data's loss_mask or labels"
        )
    return [c / total for c in counts_used]


class Weighting:
    """How an accumulation window weighs its micro-batches' mean losses, decided once for a
    model: `normalize` (batch.normalize) and whether the model's loss shifts its labels."""

    def __init__(self, normalize: str, model: nn.Module) -> None:
        self.normalize = normalize
        self.shifted = is_causal_lm(model)
        inner = getattr(model, "_orig_mod", model)
        self.model_name = type(getattr(inner, "module", inner)).__name__.removeprefix("FSDP")

    def counts(self, window: Sequence[Any]) -> tuple[list[int], list[int]]:
        """Samples and loss tokens of each micro-batch (`window_counts`)."""
        return window_counts(window, self.shifted)

    def by_tokens(self, window: Sequence[Any]) -> bool:
        return uses_tokens(window, self.normalize)

    def weights(
        self,
        window: Sequence[Any],
        counts: tuple[list[int], list[int]],
        totals: Sequence[int] | None = None,
        world_size: int = 1,
    ) -> list[float]:
        """Each micro-batch's weight (`loss_weights`)."""
        return loss_weights(window, self.normalize, counts, totals, world_size)

    def describe(self, batch: Any) -> str:
        """What the weights count and why, for one start-up line; `batch` is a micro-batch."""
        if not uses_tokens([batch], self.normalize):
            why = (
                'batch.normalize = "samples"'
                if self.normalize == "samples"
                else "the batches carry no loss_mask or per-token labels"
            )
            return f"micro-batch losses weighted by samples ({why})"
        if isinstance(batch, Mapping) and "loss_mask" in batch:
            what = "loss_mask tokens"
        elif isinstance(batch, Mapping) and "shift_labels" in batch:
            what = f"valid label tokens (shift_labels != {IGNORE_INDEX})"
        elif token_labels(batch) is not None:
            shift = (
                f"shifted: {self.model_name} is a causal LM"
                if self.shifted
                else f"not shifted: {self.model_name} is no causal LM"
            )
            what = f"valid label tokens (labels != {IGNORE_INDEX}, {shift})"
        else:
            what = "tokens (attention_mask ones, else the token ids)"
        return f"micro-batch losses weighted by their {what}, as one big batch would average them"


def call_model(model: nn.Module, batch: Any, loss_fn: LossFn | None = None) -> torch.Tensor:
    """Run the model on a batch and return the scalar loss (see the module docstring)."""
    try:
        if isinstance(batch, Mapping):
            output = model(**batch)
        elif isinstance(batch, (list, tuple)):
            output = model(*batch) if loss_fn is None else model(*batch[:-1])
        else:
            output = model(batch)
    except TypeError as exc:
        why = batch_mismatch(model, batch, loss_fn)
        if why is None:  # raised inside forward, not by the call
            raise
        raise ThriftyError(f"{why} ({exc})") from None
    if loss_fn is not None:
        try:
            loss = loss_fn(output, batch)
        except (ValueError, RuntimeError) as exc:
            if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc):
                raise  # the micro-batch is halved, not the loss_fn blamed
            raise ThriftyError(_loss_fn_failed(exc, output, batch)) from None
        if loss is None or not _is_scalar_loss(loss):
            without_target = _without_target(model, output, batch)
            if without_target is not None:
                raise ThriftyError(without_target)
        return _as_loss(loss, "loss_fn")
    return _as_loss(output, "the model")


def _shapes(value: Any) -> str:
    """A value's tensors by shape, nested as given: `((4, 16, 50), None)`."""
    if isinstance(value, torch.Tensor):
        return str(tuple(value.shape))
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_shapes(v) for v in value) + ")"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_shapes(v)}" for k, v in value.items()) + "}"
    return "None" if value is None else type(value).__name__


def _loss_fn_failed(exc: Exception, output: Any, batch: Any) -> str:
    """One line for a loss_fn that raised: what it was given, by shape, and the usual fix."""
    text = str(exc).strip().splitlines()
    said = f"{type(exc).__name__}: {text[0] if text else 'no message'}"
    line = (
        f"loss_fn(output, batch) raised {said}; it was given the model's output of shapes "
        f"{_shapes(output)} and a batch of shapes {_shapes(batch)}"
    )
    tensors = output if isinstance(output, (list, tuple)) else [output]
    if any(isinstance(t, torch.Tensor) and t.dim() == 3 for t in tensors):
        return (
            f"{line}: cross_entropy takes logits (N, vocab) and targets (N,), so flatten the "
            "positions into N: F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))"
        )
    return f"{line}: make loss_fn take these shapes"


def _without_target(model: nn.Module, output: Any, batch: Any) -> str | None:
    """Why a loss_fn found no loss in a model's (logits, None): with a loss_fn the model is
    called without the batch's target, and a model that computes its own loss (nanoGPT's
    forward(idx, targets=None)) then returns none. None where that is not what happened."""
    returned_none = isinstance(output, (list, tuple)) and any(v is None for v in output)
    if not returned_none or not isinstance(batch, (list, tuple)):
        return None
    inner = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    name = type(getattr(inner, "module", inner)).__name__  # DDP's
    return (
        f"loss_fn found no loss: given a loss_fn, thrifty calls the model on all but the batch's "
        f"last item (the target), so {name} returned {_shapes(output)}, with no loss in it. "
        "The model computes its own loss when given its target: drop loss_fn (thrifty then "
        "passes the whole batch and takes the loss the model returns), or make loss_fn compute "
        "it from the logits: F.cross_entropy(out[0].view(-1, out[0].size(-1)), "
        "batch[-1].view(-1))"
    )


def batch_mismatch(model: nn.Module, batch: Any, loss_fn: LossFn | None) -> str | None:
    """Why the model's forward cannot take the batch as `call_model` passes it, naming the fix;
    None where it can (a TypeError then came from inside forward)."""
    inner = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    inner = getattr(inner, "module", inner)  # DDP's
    try:
        signature = inspect.signature(inner.forward)
    except (TypeError, ValueError):
        return None
    empty = inspect.Parameter.empty
    bare = signature.replace(
        parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
        return_annotation=empty,
    )
    name = f"{type(inner).__name__}.forward{bare}"
    try:
        if isinstance(batch, Mapping):
            signature.bind(**batch)
        elif isinstance(batch, (list, tuple)):
            signature.bind(*(batch if loss_fn is None else batch[:-1]))
        else:
            signature.bind(batch)
    except TypeError:
        pass
    else:
        return None
    if isinstance(batch, Mapping):
        return (
            f"{name} does not take the batch's keys {', '.join(map(str, batch))} as keyword "
            "arguments: name the dataset's keys after forward's parameters, or give a "
            "loss_fn(output, batch) and a model that takes them"
        )
    if isinstance(batch, (list, tuple)) and loss_fn is None:
        return (
            f"{name} cannot take the batch's {len(batch)} items as positional arguments: give "
            "loss_fn(output, batch) (in Python, loss_fn=...; in a config, [task] loss_fn = "
            "'package.module:function'), and thrifty calls the model on all but the last item "
            "(the target)"
        )
    if isinstance(batch, (list, tuple)):
        return (
            f"{name} cannot take the batch's first {len(batch) - 1} items (all but the target, "
            "as with a loss_fn) as positional arguments: make forward take them, or return "
            "batches of (inputs, target)"
        )
    return f"{name} cannot take the batch, a {type(batch).__name__}, as its one argument"


def _as_loss(output: Any, source: str) -> torch.Tensor:
    loss = output
    if isinstance(output, (tuple, list)):  # (logits, loss): the loss when it is the only scalar
        scalars = [v for v in output if _is_scalar_loss(v)]
        loss = scalars[0] if len(scalars) == 1 else None
    elif not isinstance(loss, torch.Tensor):
        loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point():
        return loss if loss.dim() == 0 else loss.reshape(())
    desc = (
        f"a tensor of shape {tuple(output.shape)}"
        if isinstance(output, torch.Tensor)
        else f"a {type(output).__name__}"
    )
    if source == "loss_fn":
        raise ThriftyError(
            f"loss_fn returned {desc}, not a loss: make loss_fn(output, batch) return a scalar "
            "loss tensor"
        )
    raise ThriftyError(
        f"{source} returned {desc}, not a loss: return a scalar loss tensor, an output with "
        ".loss, or a tuple holding one scalar (logits, loss), or give a loss_fn(output, batch)"
    )


def _is_scalar_loss(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point()
