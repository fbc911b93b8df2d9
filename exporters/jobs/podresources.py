"""The kubelet's pod-resources API: which container the kubelet allocated each GPU to.

`v1.PodResourcesLister/List` over the kubelet's unix socket, with the client generated from the
kubelet's own api.proto (exporters/jobs/kubelet/). grpc is imported on the first call only, so a
node without the socket (a Slurm node) never loads it.

The NVIDIA device plugin names a device by its UUID, `GPU-<uuid>`, with `::N` for the N-th share
of a time-sliced or MPS GPU, and a MIG device `MIG-<uuid>` (`MIG-GPU-<uuid>/<gi>/<ci>` before
driver R470); GKE's device plugin names them by their device file, `nvidiaN`, `nvidiaN/giK` for
MIG and `/vgpuM` for a share. `gpu_of` maps each to the NVML index of its GPU.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCES = "nvidia.com/mig-*"

_GKE = re.compile(r"nvidia(\d+)(?:/gi(\d+))?(?:/vgpu\d+)?")


class SourceAbsent(Exception):
    """The source is not on this node (no kubelet socket, no mapping directory)."""


class SourceFailed(Exception):
    """The source is there but could not be read; the message says why."""


@dataclass(frozen=True)
class DeviceAssignment:
    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


@dataclass
class GpuIds:
    """How the sources name this node's GPUs, each mapped to its NVML index."""

    by_uuid: dict[str, int] = field(default_factory=dict)
    by_minor: dict[int, int] = field(default_factory=dict)
    by_mig_uuid: dict[str, int] = field(default_factory=dict)
    # (minor number, GPU instance) and (NVML index, GPU instance) of each MIG device
    mig_instances: dict[tuple[int, int], int] = field(default_factory=dict)


def gpu_of(device_id: str, ids: GpuIds) -> int | None:
    """The NVML index of the GPU a device-plugin device ID names; None when it names none here."""
    base = device_id.split("::", 1)[0]
    if base.startswith("GPU-"):
        return ids.by_uuid.get(base)
    if base.startswith("MIG-GPU-"):
        return ids.by_uuid.get(base[len("MIG-") :].split("/", 1)[0])
    if base.startswith("MIG-"):
        return ids.by_mig_uuid.get(base)
    gke = _GKE.fullmatch(base)
    if gke:
        return ids.by_minor.get(int(gke.group(1)))
    return None


def is_gpu_resource(name: str, extra: Sequence[str]) -> bool:
    return (
        name == GPU_RESOURCE
        or fnmatch.fnmatchcase(name, MIG_RESOURCES)
        or any(fnmatch.fnmatchcase(name, pattern) for pattern in extra)
    )


class PodResourcesClient:
    """One gRPC channel to the kubelet's socket, kept between calls (gRPC reconnects by itself when
    the kubelet restarts and makes its socket again)."""

    def __init__(self, socket_path: str):
        self.socket_path = socket_path
        self._lock = threading.Lock()
        self._channel: Any = None
        self._stub: Any = None

    def list(self, timeout: float) -> list[DeviceAssignment]:
        """Every device the kubelet allocated to a container, within `timeout` seconds.
        Raises SourceAbsent when there is no socket, SourceFailed when the kubelet does not answer
        well in time."""
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError as err:
            raise SourceAbsent(f"no kubelet pod-resources socket at {self.socket_path}") from err
        except OSError as err:
            raise SourceFailed(f"{self.socket_path}: {err.strerror}") from err
        if not stat.S_ISSOCK(mode):
            raise SourceFailed(f"{self.socket_path} is not a socket")
        import grpc

        from clusterhealth.exporters.jobs.kubelet import api_pb2

        stub = self._connect()
        try:
            response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise SourceFailed(f"the kubelet did not answer List within {timeout:g} s") from err
            detail = err.details() if hasattr(err, "details") else str(err)
            name = code.name if code is not None else "error"
            raise SourceFailed(f"the kubelet's List failed: {name}: {detail}") from err
        found = []
        for pod in response.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    for device_id in devices.device_ids:
                        found.append(
                            DeviceAssignment(
                                pod.namespace, pod.name, container.name, devices.resource_name, device_id
                            )
                        )
        return found

    def _connect(self) -> Any:
        with self._lock:
            if self._stub is None:
                import grpc

                from clusterhealth.exporters.jobs.kubelet import api_pb2_grpc

                self._channel = grpc.insecure_channel(f"unix://{os.path.abspath(self.socket_path)}")
                self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
            return self._stub

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._stub = None


__all__ = [
    "DEFAULT_SOCKET",
    "DeviceAssignment",
    "GpuIds",
    "PodResourcesClient",
    "SourceAbsent",
    "SourceFailed",
    "gpu_of",
    "is_gpu_resource",
]
