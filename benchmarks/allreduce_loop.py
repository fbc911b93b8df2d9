"""One rank of a synchronous data-parallel loop on Open MPI: compute, then MPI_Allreduce, per step.

Started by mpirun (benchmarks/impact.py), one rank per lab host. Each step sleeps for the compute
time (it stands for a GPU's forward and backward pass, which takes no host CPU) and then sums
SIZE_BYTES of float32 gradients across every rank with MPI_Allreduce (mpi4py, buffer interface:
no pickling, Open MPI's own reduction). The first WARMUP steps open the TCP connections (Open MPI
connects on first use) and are not counted.

Rank 0 writes OUT (JSON): every rank's address on the lab's network in rank order (the ring's
order: rank i sends to rank i+1) and, per rank, each counted step's compute and all-reduce
seconds.

Usage: mpirun ... python allreduce_loop.py SIZE_BYTES COMPUTE_SECONDS STEPS WARMUP ADDRESS_OF_MPIRUN OUT
"""

from __future__ import annotations

import array
import json
import socket
import sys
import time
from pathlib import Path

from mpi4py import MPI


def own_address(towards: str) -> str:
    """The address this rank's namespace reaches `towards` from (its lab interface's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((towards, 9))  # UDP: no packet is sent
        address: str = s.getsockname()[0]
        return address


def main(argv: list[str]) -> None:
    size_bytes, compute, steps, warmup = int(argv[1]), float(argv[2]), int(argv[3]), int(argv[4])
    towards, out = argv[5], Path(argv[6])
    comm = MPI.COMM_WORLD
    count = size_bytes // 4
    send = array.array("f", [1.0]) * count
    receive = array.array("f", bytes(4 * count))
    timings: list[list[float]] = []
    comm.Barrier()
    for step in range(warmup + steps):
        started = time.perf_counter()
        time.sleep(compute)
        computed = time.perf_counter()
        comm.Allreduce([send, MPI.FLOAT], [receive, MPI.FLOAT], op=MPI.SUM)
        done = time.perf_counter()
        if step >= warmup:
            timings.append([computed - started, done - computed])
    if receive[0] != comm.Get_size() or receive[-1] != comm.Get_size():
        raise SystemExit(
            f"rank {comm.Get_rank()}: the all-reduce summed to {receive[0]}, not {comm.Get_size()}"
        )
    addresses = comm.gather(own_address(towards), root=0)
    every = comm.gather(timings, root=0)
    if comm.Get_rank() == 0:
        document = {
            "ranks": comm.Get_size(),
            "library": MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0],
            "addresses": addresses,
            "steps": every,  # per rank, per step: [compute seconds, all-reduce seconds]
        }
        out.write_text(json.dumps(document))


if __name__ == "__main__":
    main(sys.argv)
