"""Data-parallel scaling efficiency from all-reduce time against compute time per step.

Ring all-reduce of S bytes over n GPUs takes t = 2*(n-1)/n * S / B, with B the bus bandwidth in
bytes/s per direction (nccl-tests PERFORMANCE.md defines "bus bandwidth" this way, so measured
busbw figures plug in directly).

GPUs share NVLink only within one domain, the catalog's `nvlink_domain` (8 on an HGX/DGX
baseboard of A100, H100, H200 or B200); an instance is one node. Past that the all-reduce is
hierarchical: NCCL's rings run over NVLink inside each node and cross the network between nodes,
each ring leaving each node once. Every byte of every GPU's share still passes every hop, so
each node's NICs carry 2*(n-1)/n * S per all-reduce while its NVLink hops carry the same, in
parallel and pipelined in chunks. The slower link sets the time:
t = 2*(n-1)/n * S / min(B_nvlink, B_network), with B_network the node's network bandwidth (all
NICs together); nccl-tests' bus bandwidth across nodes is likewise that of the bottleneck link.

Compute per step counts the FLOPs the job estimate counts (6*N per token, the attention term for a
known shape, the recompute of activation checkpointing), so the two sections agree.

Efficiency = compute / (compute + exposed communication):
- without overlap the whole all-reduce is exposed;
- with overlap (DDP's bucketed all-reduce during backward) it hides behind the backward pass,
  taken as 2/3 of the step's compute, and only the excess is exposed.

`efficiency_against_baseline` sets the same model beside measured throughput at several process
counts on one node (what `thrifty scale` reports).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from thrifty.errors import ConfigError
from thrifty.plan.catalog import GPU
from thrifty.plan.estimate import ModelShape, training_flops
from thrifty.plan.units import require_positive

BACKWARD_SHARE = 2.0 / 3.0  # backward is 4 of the 6 FLOPs per parameter per token
DDP_GRAD_BYTES_PER_PARAM = 4  # DDP all-reduces fp32 gradients (parameters stay fp32 under autocast)
DDP_FIRST_BUCKET = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
CLOSE = 0.10  # measured within 10 points of the prediction counts as "as predicted"
# GPUs one server holds when they have no NVLink and all-reduce over PCIe: the catalog's
# g5.48xlarge (8 A10G) and g6e.48xlarge (8 L40S).
PCIE_SERVER_GPUS = 8


def ring_factor(gpus: int) -> float:
    """Bytes a ring all-reduce moves over each link per byte reduced by `gpus` GPUs: 2(n-1)/n,
    the factor between nccl-tests' bus bandwidth and its algorithm bandwidth."""
    return 2.0 * (gpus - 1) / gpus


def allreduce_seconds(nbytes: float, gpus: int, bus_gbs: float) -> float:
    """Ring all-reduce time in seconds for `nbytes` bytes over `gpus` GPUs at `bus_gbs` GB/s
    per direction."""
    nbytes = require_positive(nbytes, "all-reduce size (bytes)")
    if not isinstance(gpus, int) or gpus <= 0:
        raise ConfigError(f"gpus must be a whole number > 0, got {gpus!r}")
    bus = require_positive(bus_gbs, "bus bandwidth (GB/s per direction)")
    return ring_factor(gpus) * nbytes / (bus * 1e9)


def node_size(gpu: GPU) -> int:
    """GPUs per node for GPUs given without an instance: one NVLink domain (the catalog's
    `nvlink_domain`), or a PCIe server of PCIE_SERVER_GPUS for GPUs without NVLink."""
    return gpu.nvlink_domain if gpu.nvlink_domain > 1 else PCIE_SERVER_GPUS


def node_layout(gpus: int, per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) for `gpus` GPUs in nodes of at most `per_node`: the fewest nodes
    of equal size. Only whether the ring leaves a node changes its time, so an uneven count is
    placed in more, smaller nodes rather than refused."""
    for value, name in ((gpus, "gpus"), (per_node, "GPUs per node")):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{name} must be a whole number > 0, got {value!r}")
    nodes = math.ceil(gpus / per_node)
    while gpus % nodes:
        nodes += 1
    return nodes, gpus // nodes


def step_compute_seconds(
    model: float | ModelShape,
    tokens_per_gpu: float,
    peak_flops: float,
    mfu: float,
    recompute: str | float = "none",
) -> float:
    """Compute time per optimizer step per GPU in seconds: the training FLOPs of
    `tokens_per_gpu` tokens (as the job estimate counts them: 6*N, attention for a shape,
    recompute) / (peak FLOP/s x MFU)."""
    flops = training_flops(model, tokens_per_gpu, recompute=recompute)
    return flops.total / (peak_flops * mfu)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scaling:
    """Scaling efficiency of data parallelism. Times in seconds, bandwidth GB/s per direction."""

    gpus_per_node: int
    nodes: int
    gradient_bytes: float
    bus_gbs: float
    bus_limited_by: str
    compute_seconds: float
    allreduce_seconds: float
    efficiency_no_overlap: float
    efficiency_overlap: float
    assumptions: list[str] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def effective_gpus_no_overlap(self) -> float:
        return self.gpus * self.efficiency_no_overlap

    @property
    def effective_gpus_overlap(self) -> float:
        return self.gpus * self.efficiency_overlap

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data.update(
            gpus=self.gpus,
            effective_gpus_no_overlap=self.effective_gpus_no_overlap,
            effective_gpus_overlap=self.effective_gpus_overlap,
        )
        return data


def scaling(
    params: float,
    *,
    gpus_per_node: int,
    nodes: int = 1,
    compute_seconds: float,
    intra_node_gbs: float,
    inter_node_gbs: float | None = None,
    grad_bytes_per_param: float = 4.0,
) -> Scaling:
    """Scaling efficiency of data-parallel training with and without compute/comm overlap.

    `compute_seconds` is the compute time per optimizer step on one GPU; `intra_node_gbs` the
    all-reduce bus bandwidth inside a node and `inter_node_gbs` the node's network bandwidth,
    both in GB/s per direction; with more than one node the slower of the two sets the time.
    `grad_bytes_per_param` is 4 for fp32 gradients (DDP under torch.autocast) or 2 for 16-bit
    gradients.
    """
    params = require_positive(params, "params")
    for name, value in (("gpus_per_node", gpus_per_node), ("nodes", nodes)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{name} must be a whole number > 0, got {value!r}")
    compute = require_positive(compute_seconds, "compute time per step (seconds)")
    grad_bytes = params * require_positive(grad_bytes_per_param, "gradient bytes per parameter")
    bus, limit = _bus(gpus_per_node, nodes, intra_node_gbs, inter_node_gbs)
    n = gpus_per_node * nodes
    comm = allreduce_seconds(grad_bytes, n, bus) if n > 1 else 0.0
    exposed = max(0.0, comm - BACKWARD_SHARE * compute)
    return Scaling(
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        gradient_bytes=grad_bytes,
        bus_gbs=bus,
        bus_limited_by=limit,
        compute_seconds=compute,
        allreduce_seconds=comm,
        efficiency_no_overlap=compute / (compute + comm),
        efficiency_overlap=compute / (compute + exposed),
        assumptions=[
            _algorithm_note(gpus_per_node, nodes),
            f"gradients {grad_bytes_per_param:g} bytes/param"
            + (
                " (fp32, as DDP all-reduces under torch.autocast)"
                if grad_bytes_per_param == 4
                else ""
            ),
            f"bus bandwidth {bus:g} GB/s per direction, limited by {limit}",
            "overlap hides communication behind backward (2/3 of compute); "
            "no overlap adds it to the step",
        ],
    )


def _algorithm_note(gpus_per_node: int, nodes: int) -> str:
    ring = "t = 2(n-1)/n x gradient bytes / bus bandwidth (nccl-tests PERFORMANCE.md)"
    if nodes == 1:
        return f"ring all-reduce {ring}"
    return (
        f"hierarchical all-reduce over {nodes} nodes of {gpus_per_node} GPUs: NCCL's rings use "
        "the intra-node link (NVLink or PCIe) inside a node and the network between, each "
        f"node's NICs carrying 2(n-1)/n x gradient bytes, so the slower link sets {ring}"
    )


def _bus(gpus_per_node: int, nodes: int, intra: float, inter: float | None) -> tuple[float, str]:
    intra = require_positive(intra, "intra-node bus bandwidth (GB/s per direction)")
    if nodes == 1:
        return intra, "the intra-node link"
    if inter is None:
        raise ConfigError(
            f"{gpus_per_node * nodes} GPUs span {nodes} nodes of {gpus_per_node}, so the "
            "all-reduce crosses the network: give --network-bandwidth (e.g. 400Gb/s) or an "
            "--instance with network_gbits in the catalog"
        )
    inter = require_positive(inter, "inter-node network bandwidth (GB/s per direction)")
    return (inter, "the node's network") if inter < intra else (intra, "the intra-node link")


# --------------------------------------------------------------------------------------------
# Beside a measurement: several process counts on one node


def overlap_applies(device: str, gradient_bytes: float) -> tuple[bool, str]:
    """Whether the 'with overlap' efficiency describes DDP on `device` ("cpu" or "cuda") with
    `gradient_bytes` bytes of gradients, and why."""
    if device != "cuda":
        return False, "gloo on CPU reduces on the cores that run backward, so little is hidden"
    if gradient_bytes <= DDP_FIRST_BUCKET:
        return False, "the gradients fit DDP's first 1 MiB bucket, reduced only once backward ends"
    return True, "DDP all-reduces gradient buckets on its own CUDA stream while backward runs"


def single_node_efficiency(
    params: float, processes: int, one_process_seconds: float, bus_gbs: float | None
) -> dict[str, float]:
    """`scaling` for `processes` on one node: each computes 1/N of the step one process takes
    (`one_process_seconds`), then all-reduces fp32 gradients at `bus_gbs` GB/s per direction.
    Efficiencies without and with overlap, and the all-reduce time in seconds."""
    if processes == 1:
        return {"no_overlap": 1.0, "overlap": 1.0, "allreduce_seconds": 0.0}
    s = scaling(
        params,
        gpus_per_node=processes,
        compute_seconds=one_process_seconds / processes,
        intra_node_gbs=bus_gbs or 0.0,
        grad_bytes_per_param=DDP_GRAD_BYTES_PER_PARAM,
    )
    return {
        "no_overlap": s.efficiency_no_overlap,
        "overlap": s.efficiency_overlap,
        "allreduce_seconds": s.allreduce_seconds,
    }


def efficiency_against_baseline(
    params: float,
    throughput: Mapping[int, float],
    one_process_seconds: float,
    bus: Mapping[int, float],
    overlap: bool,
) -> dict[int, dict[str, Any]]:
    """By process count: speed-up and efficiency measured against the smallest count, beside
    the predicted efficiency relative to that count, as the measured one is.

    `throughput` is each count's rate (any unit per second), `one_process_seconds` the step of
    the whole global batch on one process, `bus` the bus bandwidth (GB/s per direction) of each
    count above 1, and `overlap` which prediction applies (see `overlap_applies`).
    """
    counts = sorted(throughput)
    base_n = counts[0]
    base = single_node_efficiency(params, base_n, one_process_seconds, bus.get(base_n))
    rows = {}
    for n in counts:
        speedup = throughput[n] / throughput[base_n]
        pred = single_node_efficiency(params, n, one_process_seconds, bus.get(n))
        no_overlap = pred["no_overlap"] / base["no_overlap"]
        with_overlap = pred["overlap"] / base["overlap"]
        rows[n] = {
            "speedup": speedup,
            "efficiency": speedup / (n / base_n),
            "bus_gbs": bus.get(n),
            "predicted_allreduce_seconds": pred["allreduce_seconds"],
            "predicted_efficiency_no_overlap": no_overlap,
            "predicted_efficiency_overlap": with_overlap,
            "predicted_efficiency": with_overlap if overlap else no_overlap,
        }
    return rows


def scaling_conclusion(rows: Sequence[Mapping[str, Any]], overlap: bool, unit: str) -> str:
    """One line on the largest count of `efficiency_against_baseline`'s rows (with
    `processes` and `omp_num_threads` added): does adding processes pay, and as the model said?
    `overlap` names the prediction that applies; `unit` the throughput's."""
    base, top = rows[0], rows[-1]
    if len(rows) == 1:
        return f"only {base['processes']} process(es) measured: give two or more counts to compare"
    n, n0 = top["processes"], base["processes"]
    measured, predicted = top["efficiency"], top["predicted_efficiency"]
    head = (
        f"{n} processes give {top['speedup']:.2f}x the {unit} of {n0} ({measured:.0%} "
        f"efficient); the planner predicted {predicted:.0%} ({'with' if overlap else 'no'} overlap)"
    )
    gap = round((measured - predicted) * 100)
    if top["speedup"] < 1:
        return f"{head}: more processes are slower here, keep {n0}"
    if abs(gap) <= CLOSE * 100:
        return f"{head}: as predicted"
    if gap < 0:
        return (
            f"{head}: {-gap} points lower, so the step has costs the all-reduce model leaves out "
            "(work every process repeats, ranks waiting for each other, cores shared by compute "
            "and communication)"
        )
    threads0, threads = base["omp_num_threads"], top["omp_num_threads"]
    if threads0 is not None and threads0 != threads:
        return (
            f"{head}: {gap} points higher, so one process made less of {threads0} threads than "
            f"{n} processes of {threads} each (OMP_NUM_THREADS=1 compares at equal threads)"
        )
    return f"{head}: {gap} points higher, so more of the all-reduce was hidden than modelled"
