"""What fakes the hardware, apart from what reads it: the simulated node of demos and tests.

* `nvml`: a simulated NVML library installed below the real pynvml calls;
* `scenario`: the format of `scenarios/`, read and checked into a frozen `Scenario`;
* `sysfs`: the simulated node's /sys (RDMA devices, netdevs, PCIe links), also the fixture builder;
* `scenarios/`: simulated GPUs and their faults in time (YAML).
"""
