"""Data-parallel scaling efficiency from ring all-reduce time against compute time per step.

Ring all-reduce of S bytes over n GPUs takes t = 2*(n-1)/n * S / B, with B the bus bandwidth in
bytes/s per direction (nccl-tests PERFORMANCE.md defines "bus bandwidth" this way, so measured
busbw figures plug in directly). Within a node B is the NVLink/PCIe bus bandwidth; across nodes
the ring crosses the network, and B is at most the node's network bandwidth (all NICs together).

Efficiency = compute / (compute + exposed communication):
- without overlap the whole all-reduce is exposed;
- with overlap (DDP's bucketed all-reduce during backward) it hides behind the backward pass,
  taken as 2/3 of the step's compute, and only the excess is exposed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from thrifty.errors import ConfigError
from thrifty.plan.units import require_positive

BACKWARD_SHARE = 2.0 / 3.0  # backward is 4 of the 6 FLOPs per parameter per token


def allreduce_seconds(nbytes: float, gpus: int, bus_gbs: float) -> float:
    """Ring all-reduce time in seconds for `nbytes` bytes over `gpus` GPUs at `bus_gbs` GB/s
    per direction."""
    nbytes = require_positive(nbytes, "all-reduce size (bytes)")
    if not isinstance(gpus, int) or gpus <= 0:
        raise ConfigError(f"gpus must be a whole number > 0, got {gpus!r}")
    bus = require_positive(bus_gbs, "bus bandwidth (GB/s per direction)")
    return 2.0 * (gpus - 1) / gpus * nbytes / (bus * 1e9)


def step_compute_seconds(
    params: float, tokens_per_gpu: float, peak_flops: float, mfu: float
) -> float:
    """Compute time per optimizer step per GPU in seconds: 6*N*tokens / (peak FLOP/s x MFU)."""
    return 6.0 * params * tokens_per_gpu / (peak_flops * mfu)


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
    both in GB/s per direction. `grad_bytes_per_param` is 4 for fp32 gradients (DDP under
    torch.autocast) or 2 for 16-bit gradients.
    """
    params = require_positive(params, "params")
    for name, value in (("gpus_per_node", gpus_per_node), ("nodes", nodes)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{name} must be a whole number > 0, got {value!r}")
    compute = require_positive(compute_seconds, "compute time per step (seconds)")
    grad_bytes = params * require_positive(grad_bytes_per_param, "gradient bytes per parameter")
    bus, limit = _bus(nodes, intra_node_gbs, inter_node_gbs)
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
            "ring all-reduce t = 2(n-1)/n x gradient bytes / bus bandwidth (nccl-tests)",
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


def _bus(nodes: int, intra: float, inter: float | None) -> tuple[float, str]:
    intra = require_positive(intra, "intra-node bus bandwidth (GB/s per direction)")
    if nodes == 1:
        return intra, "the intra-node link"
    if inter is None:
        raise ConfigError(
            "nodes > 1 needs the network bandwidth: give --network-bandwidth (e.g. 400Gb/s) "
            "or an instance with network_gbits in the catalog"
        )
    inter = require_positive(inter, "inter-node network bandwidth (GB/s per direction)")
    return (inter, "the node's network") if inter < intra else (intra, "the intra-node link")
