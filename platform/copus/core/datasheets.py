"""Hardware descriptions as data: the accelerator nodes of the COPUS paper's clusters.

Used by the memory model (device memory) and by the simulator, which turns these figures
into step-time model coefficients for clusters we cannot profile. Figures are vendor peak
numbers (dense, no sparsity); links are per direction. Where a site's cluster differs (another
interconnect, fewer NICs), describe it with another `NodeSpec` rather than editing these.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

GB = 1e9
GIB = 1024**3


@dataclass(frozen=True)
class AcceleratorSpec:
    name: str
    peak_bf16_flops: float  # dense matrix-multiply peak, FLOP/s
    memory_bytes: float  # device memory (HBM)
    memory_bandwidth: float  # HBM bytes/s
    # Model-FLOPs utilisation of a transformer micro-batch as a function of its width w in tokens:
    # MFU(w) = mfu_max x w / (w + mfu_half_tokens). Small micro-batches leave the matrix units idle
    # (launch and memory bound); large ones approach the best MFU reported for Megatron-style
    # training on the part. `mfu_tokens` says what w counts under tensor parallelism:
    # "rank", the rank's share of the tokens (mbs x seq_len / tp: tp shrinks the matmuls like a
    # smaller micro-batch), or "micro_batch", all of them (mbs x seq_len: Megatron's tensor
    # parallelism keeps every token as a row of each rank's matmuls and splits the columns).
    mfu_max: float = 0.5
    mfu_half_tokens: float = 1024.0
    mfu_tokens: str = "rank"

    def mfu(self, width_tokens: float) -> float:
        return self.mfu_max * width_tokens / (width_tokens + self.mfu_half_tokens)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    accelerator: AcceleratorSpec
    accelerators_per_node: int
    intra_node_bandwidth: float  # bytes/s per accelerator per direction to its peers (NVLink / Infinity Fabric)
    intra_node_latency_s: float
    inter_node_bandwidth: float  # bytes/s per accelerator per direction across nodes (its share of the NICs)
    inter_node_latency_s: float
    runtime_overhead_bytes: float  # CUDA/ROCm context, communicator buffers: memory never available to tensors
    source: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


MFU_TOKENS = ("rank", "micro_batch")


def with_mfu(
    node: NodeSpec, mfu_max: float | None, mfu_half_tokens: float | None, mfu_tokens: str | None = None
) -> NodeSpec:
    """`node` with its accelerator's MFU curve replaced where a value is given (None keeps it)."""
    if mfu_tokens is not None and mfu_tokens not in MFU_TOKENS:
        raise ValueError(f"mfu_tokens must be one of {MFU_TOKENS}, got {mfu_tokens!r}")
    acc = node.accelerator
    acc = replace(
        acc,
        mfu_max=acc.mfu_max if mfu_max is None else mfu_max,
        mfu_half_tokens=acc.mfu_half_tokens if mfu_half_tokens is None else mfu_half_tokens,
        mfu_tokens=acc.mfu_tokens if mfu_tokens is None else mfu_tokens,
    )
    return replace(node, accelerator=acc)


# MFU, its public sources per part in docs/simulator.md ("The MFU curve"): on H100 Megatron-LM
# reports up to 47% and MosaicML's llm-foundry tables 35-46% at 4k-49k tokens per micro-batch;
# on CDNA2 (MI250X, Dash et al. 2023) 32-38% of peak. The half-saturation points are our
# assumption (about one 2k-token sequence per rank on H100, less on the slower MI210, which
# saturates sooner); both are plain fields to override (`cluster.mfu_max`/`.mfu_half_tokens`).
H100_SXM = AcceleratorSpec(
    "NVIDIA H100 SXM5 80GB",
    peak_bf16_flops=989.4e12,
    memory_bytes=80 * GB,
    memory_bandwidth=3.35e12,
    mfu_max=0.50,
    mfu_half_tokens=2048.0,
)
MI210 = AcceleratorSpec(
    "AMD Instinct MI210 64GB",
    peak_bf16_flops=181.0e12,
    memory_bytes=64 * GB,
    memory_bandwidth=1.6384e12,
    mfu_max=0.38,
    mfu_half_tokens=1024.0,
)

NODES: dict[str, NodeSpec] = {
    "h100-sxm-8": NodeSpec(
        "8x H100 SXM5 (DGX/HGX H100)",
        H100_SXM,
        8,
        # NVLink 4 through NVSwitch: 900 GB/s bidirectional per GPU.
        intra_node_bandwidth=450 * GB,
        intra_node_latency_s=3e-6,
        # One 400 Gb/s NDR InfiniBand NIC per GPU.
        inter_node_bandwidth=50 * GB,
        inter_node_latency_s=5e-6,
        runtime_overhead_bytes=2 * GIB,
        source="NVIDIA H100 Tensor Core GPU datasheet; DGX H100 user guide",
    ),
    "mi210-8": NodeSpec(
        "8x MI210 (two Infinity Fabric hives of 4)",
        MI210,
        8,
        # Infinity Fabric Link bridge: 3 links x 100 GB/s (peer-to-peer, bidirectional) within a hive of 4;
        # the two hives meet over PCIe 4.0 x16 (32 GB/s per direction), which bounds a ring over all 8.
        intra_node_bandwidth=32 * GB,
        intra_node_latency_s=5e-6,
        # One 200 Gb/s HDR InfiniBand NIC per two GPUs (typical for such nodes; set your own).
        inter_node_bandwidth=12.5 * GB,
        inter_node_latency_s=5e-6,
        runtime_overhead_bytes=2 * GIB,
        source="AMD Instinct MI210 datasheet; interconnect per node as commonly deployed",
    ),
    # A node of the emulated cluster (docs/emulated-cluster.md): one CPU core, its Ray worker and
    # its network namespace, joined to the others by a link capped at 185 Mbit/s each way. Only a
    # simulation with a measured profile uses it (`cluster.profile`: the step times are the
    # profile's, so the compute figures here are placeholders); the link prices the training state
    # an in-place reshard moves.
    "cpu-core-emulated": NodeSpec(
        "1 CPU core of an emulated node (network namespace, 185 Mbit/s link)",
        AcceleratorSpec(
            "CPU core (emulated node)", peak_bf16_flops=50e9, memory_bytes=24 * GIB, memory_bandwidth=20 * GB
        ),
        1,
        intra_node_bandwidth=10 * GB,
        intra_node_latency_s=1e-6,
        inter_node_bandwidth=185e6 / 8,
        inter_node_latency_s=1e-4,
        runtime_overhead_bytes=0.5 * GIB,
        source="docs/emulated-cluster.md: tc tbf 185 Mbit/s between namespaces on the 2-core CPU machine",
    ),
}
