"""Kubernetes attribution through the kubelet's pod-resources API.

The kubelet is the hardware boundary here: a real gRPC server on a unix socket, implementing
`v1.PodResourcesLister` from the same generated code the agent's client uses, answers `List` with
every device-ID shape the NVIDIA and GKE device plugins report, then hangs, answers garbage, or is
not there. The agent's side is real: its gpu collector on the simulated NVML, its jobs collector,
its client, its sampler.
"""

from __future__ import annotations

import copy
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from clusterhealth.exporters.jobs.kubelet import api_pb2, api_pb2_grpc, generate
from clusterhealth.exporters.sim import procfs as sim_procfs
from clusterhealth.exporters.sim.scenario import parse_scenario

from .conftest import FIXTURES, AgentProcess, samples, scenario, value
from .jobs import gauge, gpu_uuids, info_rows, jobs_node, mig_uuids

# Eight GPUs whose device files are numbered backwards (GPU i is /dev/nvidia(7-i)): GKE's nvidiaN
# names a GPU by its minor number, not by NVML's index. GPU 3 is in MIG mode with two instances.
NODE = scenario(
    gpu_count=8,
    gpus={
        **{i: {"minor_number": 7 - i} for i in range(8)},
        3: {"minor_number": 4, "mig_devices": [{"gpu_instance_id": 1}, {"gpu_instance_id": 2}]},
    },
)
UUIDS = gpu_uuids(NODE)
# A training process's cgroup in Slurm's v2 layout: job 3385 (tests/fixtures/cgroup/README.md).
SLURM_V2 = (FIXTURES / "cgroup" / "slurm-v2.txt").read_text()
MIG = mig_uuids(NODE, 3)


def pod(namespace: str, name: str, *containers: tuple[str, str, list[str]]) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        namespace=namespace,
        name=name,
        containers=[
            api_pb2.ContainerResources(
                name=container,
                devices=[api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)],
            )
            for container, resource, ids in containers
        ],
    )


PODS = [
    pod("ml", "train-0", ("trainer", "nvidia.com/gpu", [UUIDS[0], UUIDS[1]])),
    # Time-slicing with renamed resources: two pods share GPU 2.
    pod("ml", "share-a", ("main", "nvidia.com/gpu.shared", [f"{UUIDS[2]}::0"])),
    pod("ml", "share-b", ("main", "nvidia.com/gpu.shared", [f"{UUIDS[2]}::1"])),
    # MIG devices of GPU 3, one of them shared; a MIG UUID of drivers before R470 names GPU 4.
    pod("ml", "mig-a", ("main", "nvidia.com/mig-1g.10gb", [MIG[0]])),
    pod("ml", "mig-b", ("main", "nvidia.com/mig-3g.40gb", [f"{MIG[1]}::2"])),
    pod("ml", "mig-old", ("main", "nvidia.com/mig-1g.10gb", [f"MIG-{UUIDS[4]}/1/0"])),
    # GKE's device plugin: the device file's number, MIG partitions and shares of it.
    pod("gke", "whole", ("main", "nvidia.com/gpu", ["nvidia2"])),
    pod("gke", "partition", ("main", "nvidia.com/gpu", ["nvidia1/gi3"])),
    pod("gke", "shared", ("main", "nvidia.com/gpu", ["nvidia0/vgpu4"])),
    # A configured extra resource name; a NIC, which is no GPU; a GPU this node does not have.
    pod("ml", "custom", ("main", "example.org/gpu", [UUIDS[7]])),
    pod("net", "rdma", ("main", "rdma/hca", ["mlx5_0"])),
    pod("ml", "ghost", ("main", "nvidia.com/gpu", ["GPU-00000000-0000-0000-0000-000000000000"])),
    # A pod with a sidecar that has no device.
    api_pb2.PodResources(namespace="ml", name="idle", containers=[api_pb2.ContainerResources(name="side")]),
]

EXPECTED = [
    ("0", "kubernetes", "", "ml", "train-0", "trainer", "pod_resources"),
    ("1", "kubernetes", "", "ml", "train-0", "trainer", "pod_resources"),
    ("2", "kubernetes", "", "ml", "share-a", "main", "pod_resources"),
    ("2", "kubernetes", "", "ml", "share-b", "main", "pod_resources"),
    ("3", "kubernetes", "", "ml", "mig-a", "main", "pod_resources"),
    ("3", "kubernetes", "", "ml", "mig-b", "main", "pod_resources"),
    ("4", "kubernetes", "", "ml", "mig-old", "main", "pod_resources"),
    ("5", "kubernetes", "", "gke", "whole", "main", "pod_resources"),
    ("6", "kubernetes", "", "gke", "partition", "main", "pod_resources"),
    ("7", "kubernetes", "", "gke", "shared", "main", "pod_resources"),
    ("7", "kubernetes", "", "ml", "custom", "main", "pod_resources"),
]


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's pod-resources service; `mode` is how it answers List."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.pods = PODS
        self.release = threading.Event()
        self.calls = 0

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: Any
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        if self.mode == "hang":
            self.release.wait(30)
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)


def _garbage(response: Any) -> bytes:
    # Not a ListPodResourcesResponse: field 1 as a varint whose bytes never end.
    return b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[FakeKubelet, Path]]:
    path = tmp_path / "kubelet.sock"
    service = FakeKubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(service, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    yield service, path
    service.release.set()
    server.stop(0)


def garbage_kubelet(path: Path) -> grpc.Server:
    """A server on the kubelet's method whose answer is no protobuf message."""
    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {
            "List": grpc.unary_unary_rpc_method_handler(
                lambda request, context: None,
                request_deserializer=api_pb2.ListPodResourcesRequest.FromString,
                response_serializer=_garbage,
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


def test_the_generated_client_is_what_make_generate_writes() -> None:
    for name, content in generate.generate().items():
        assert (generate.HERE / name).read_bytes() == content, f"{name}: run `make generate`"


def test_every_device_id_shape_names_its_gpu(tmp_path: Path, kubelet: tuple[FakeKubelet, Path]) -> None:
    service, socket_path = kubelet
    node = jobs_node(
        tmp_path,
        NODE,
        pod_resources_socket=str(socket_path),
        extra_resources=["nvidia.com/gpu.shared", "example.org/*"],
    )
    try:
        status = node.run()
    finally:
        node.close()
    assert status.success, status.reason
    assert info_rows(status) == EXPECTED
    uuid_of = {labels["gpu"]: labels["uuid"] for labels, _ in _info(status)}
    assert uuid_of == {str(i): UUIDS[i] for i in range(8)}  # a MIG device's row carries its GPU's uuid
    assert gauge(status, "clusterhealth_gpu_job_source_success", source="pod_resources") == 1
    assert gauge(status, "clusterhealth_gpu_job_conflicting_gpus") == 0
    assert service.calls == 1


def test_time_slicing_without_renaming_shares_plain_nvidia_com_gpu(
    tmp_path: Path, kubelet: tuple[FakeKubelet, Path]
) -> None:
    """The device plugin's time-slicing with `renameByDefault: false` keeps the resource
    `nvidia.com/gpu` and hands out `GPU-<uuid>::N` replicas: each pod on the GPU is a workload of
    it, and a container given two replicas of one GPU is one workload, not two series."""
    service, socket_path = kubelet
    service.pods = [
        pod("ml", "slice-a", ("main", "nvidia.com/gpu", [f"{UUIDS[5]}::0"])),
        pod("ml", "slice-b", ("main", "nvidia.com/gpu", [f"{UUIDS[5]}::3"])),
        pod("ml", "two-slices", ("main", "nvidia.com/gpu", [f"{UUIDS[6]}::1", f"{UUIDS[6]}::2"])),
    ]
    node = jobs_node(tmp_path, NODE, pod_resources_socket=str(socket_path))  # no extra resource names
    try:
        status = node.run()
    finally:
        node.close()
    assert status.success, status.reason
    assert info_rows(status) == [
        ("5", "kubernetes", "", "ml", "slice-a", "main", "pod_resources"),
        ("5", "kubernetes", "", "ml", "slice-b", "main", "pod_resources"),
        ("6", "kubernetes", "", "ml", "two-slices", "main", "pod_resources"),
    ]
    assert {labels["uuid"] for labels, _ in _info(status)} == {UUIDS[5], UUIDS[6]}
    assert gauge(status, "clusterhealth_gpu_job_conflicting_gpus") == 0


def _info(status: Any) -> list[tuple[dict[str, str], float]]:
    from .jobs import samples

    return list(samples(status.families, "clusterhealth_gpu_job_info"))


def test_a_kubelet_that_hangs_fails_its_source_in_time_and_the_rest_still_exports(
    tmp_path: Path, kubelet: tuple[FakeKubelet, Path], caplog: pytest.LogCaptureFixture
) -> None:
    service, socket_path = kubelet
    service.mode = "hang"
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "7").write_text("4242\n")  # the Prolog's file for /dev/nvidia7: GPU 0
    node = jobs_node(
        tmp_path, NODE, pod_resources_socket=str(socket_path), mapping_dir=str(mapping), timeout_seconds=2
    )
    try:
        with caplog.at_level(logging.INFO):
            started = time.monotonic()
            first = node.run()
            elapsed = time.monotonic() - started
            second = node.run()
    finally:
        node.close()
    # The call is bounded by half the collector's timeout: the run ends, it is not reported hung.
    assert elapsed < 2, elapsed
    for status in (first, second):
        assert not status.success
        assert status.reason is not None and "the kubelet did not answer List within 1 s" in status.reason
        assert gauge(status, "clusterhealth_gpu_job_source_success", source="pod_resources") == 0
        assert gauge(status, "clusterhealth_gpu_job_source_success", source="mapping_dir") == 1
        assert info_rows(status) == [("0", "slurm", "4242", "", "", "", "mapping_dir")]
    said = [r for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]


def test_a_garbage_reply_fails_the_source_and_the_rest_still_exports(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    server = garbage_kubelet(path)
    mapping = tmp_path / "jobs"
    mapping.mkdir()
    (mapping / "0").write_text("4242\n")  # /dev/nvidia0 is GPU 7
    node = jobs_node(tmp_path, NODE, pod_resources_socket=str(path), mapping_dir=str(mapping))
    try:
        status = node.run()
    finally:
        node.close()
        server.stop(0)
    assert not status.success
    assert status.reason is not None and "the kubelet's List failed" in status.reason
    assert gauge(status, "clusterhealth_gpu_job_source_success", source="pod_resources") == 0
    assert info_rows(status) == [("7", "slurm", "4242", "", "", "", "mapping_dir")]


def test_a_missing_socket_is_no_failure_and_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = jobs_node(tmp_path, NODE, pod_resources_socket=str(tmp_path / "absent.sock"))
    try:
        with caplog.at_level(logging.INFO):
            statuses = [node.run(), node.run()]
    finally:
        node.close()
    for status in statuses:
        assert status.success, status.reason
        assert gauge(status, "clusterhealth_gpu_job_source_success", source="pod_resources") is None
        assert info_rows(status) == []
    said = [r for r in caplog.records if "no kubelet pod-resources socket" in r.getMessage()]
    assert len(said) == 1


def test_a_socket_nobody_listens_on_fails_the_source(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # the kubelet died and left its socket file behind
    node = jobs_node(tmp_path, NODE, pod_resources_socket=str(path), timeout_seconds=2)
    try:
        started = time.monotonic()
        status = node.run()
        assert time.monotonic() - started < 2
    finally:
        node.close()
        stale.close()
    assert not status.success
    assert gauge(status, "clusterhealth_gpu_job_source_success", source="pod_resources") == 0


def test_a_file_where_the_socket_should_be_fails_the_source(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    path.write_text("not a socket")
    node = jobs_node(tmp_path, NODE, pod_resources_socket=str(path))
    try:
        status = node.run()
    finally:
        node.close()
    assert not status.success and status.reason is not None and "is not a socket" in status.reason


def test_the_agent_exports_each_sources_join_series(
    tmp_path: Path, kubelet: tuple[FakeKubelet, Path], agent_process: Callable[..., AgentProcess]
) -> None:
    """One real agent process with a kubelet socket, a job-mapping directory and a /proc: its
    /metrics carries a join series from each source (pod_resources for GPU 1, mapping_dir for the
    Prolog's file of /dev/nvidia5, which is GPU 2, cgroup for GPU 4's training process)."""
    service, socket_path = kubelet
    service.pods = [pod("ml", "train-0", ("trainer", "nvidia.com/gpu", [UUIDS[1]]))]
    data = copy.deepcopy(NODE)
    data["gpus"][4]["compute_processes"] = [{"pid": 4242, "cgroup": SLURM_V2}]
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(data))
    sim_procfs.build(tmp_path / "proc", parse_scenario(data, "<test>"))
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "5").write_text("4242\n")
    (tmp_path / "sys").mkdir()
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump({"collectors": {"gpu": {"interval_seconds": 1}, "jobs": {"interval_seconds": 1}}})
    )
    agent = agent_process(
        "--config",
        str(tmp_path / "config.yaml"),
        "--simulate",
        str(tmp_path / "scenario.yaml"),
        "--sysfs-root",
        str(tmp_path / "sys"),
        "--procfs-root",
        str(tmp_path / "proc"),
        "--kmsg-path",
        "/dev/null",
        "--pod-resources-socket",
        str(socket_path),
        "--job-mapping-dir",
        str(tmp_path / "jobs"),
    )

    def joins() -> dict[str, dict[str, str]]:
        return {
            dict(labels)["source"]: dict(labels)
            for (name, labels), v in samples(agent.metrics()).items()
            if name == "clusterhealth_gpu_job_info" and v == 1
        }

    agent.wait_for(lambda: len(joins()) == 3, timeout=30, what="a join series from each source")
    found = joins()
    assert {k: v for k, v in found["pod_resources"].items() if k != "uuid"} == {
        "gpu": "1",
        "scheduler": "kubernetes",
        "job": "",
        "namespace": "ml",
        "pod": "train-0",
        "container": "trainer",
        "source": "pod_resources",
    }
    assert found["pod_resources"]["uuid"] == UUIDS[1]
    assert (found["mapping_dir"]["gpu"], found["mapping_dir"]["job"]) == ("2", "4242")
    assert (found["cgroup"]["gpu"], found["cgroup"]["job"]) == ("4", "3385")
    assert {labels["source"] for labels in found.values()} == {"pod_resources", "mapping_dir", "cgroup"}
    text = agent.metrics()
    for source in ("pod_resources", "mapping_dir", "cgroup"):
        assert value(text, "clusterhealth_gpu_job_source_success", source=source) == 1.0
    assert service.calls >= 1
