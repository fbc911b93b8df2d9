"""The one place that decides what an NVML error means.

Every NVML query of the agent goes through `NvmlSession.query`, which sorts pynvml's exceptions into
three outcomes so that callers never scatter try/except:

* the value is simply not there (`NotSupported` and friends): `query` returns None and the series
  is absent;
* the GPU is gone (`GpuIsLost`, a reset required, ...): `GpuGone` is raised and the GPU is exported
  with `clusterhealth_gpu_up` 0 while the other GPUs carry on;
* the library itself is unusable (not installed, driver not loaded, driver/library mismatch):
  `NvmlUnavailable` is raised and the whole collector reports failure until NVML comes back.

Any other error on one call leaves that one series absent; it is counted per call and error so an
operator can see why a value is missing.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import pynvml

T = TypeVar("T")


def _installed_version() -> str:
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


# The nvidia-ml-py release the agent runs with. pyproject allows a range of them, and each release
# adds the names of its driver's new calls, structs and constants: a name an older release lacks
# goes through `optional`, so that its series is absent there rather than the import failing.
PYNVML_VERSION = _installed_version()
# pynvml name -> what is left out without it, for the names the installed release lacks.
MISSING_NAMES: dict[str, str] = {}


def optional(name: str, leaves_out: str) -> Any:
    """pynvml's `name`, or None (remembered with what is left out) where this release predates it."""
    found = getattr(pynvml, name, None)
    if found is None:
        MISSING_NAMES.setdefault(name, leaves_out)
    return found


_missing_said = False


def say_missing_names_once(log: logging.Logger) -> None:
    """Log `missing_names_message` the first time a collector reads NVML in this process."""
    global _missing_said
    if _missing_said or not MISSING_NAMES:
        return
    message = missing_names_message()
    if message is not None:
        _missing_said = True
        log.warning("%s", message)


def missing_names_message() -> str | None:
    """One sentence naming what the installed nvidia-ml-py lacks and what is therefore not exported."""
    if not MISSING_NAMES:
        return None
    by_what: dict[str, list[str]] = {}
    for name, what in MISSING_NAMES.items():
        by_what.setdefault(what, []).append(name)
    parts = "; ".join(f"{what} ({', '.join(sorted(names))})" for what, names in sorted(by_what.items()))
    return (
        f"nvidia-ml-py {PYNVML_VERSION} predates names the agent reads, so these are not exported: "
        f"{parts}. A newer nvidia-ml-py (and a driver of its release) has them"
    )


# The value does not exist on this GPU, driver or configuration: absent, and not worth a log line.
ABSENT = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_NO_DATA,
        pynvml.NVML_ERROR_DEPRECATED,
    }
)
# The device no longer answers: everything else about it is unknown.
# NVML_ERROR_GPU_NOT_FOUND is 28 in nvml.h; nvidia-ml-py 12.535 has neither the name nor its class.
GPU_NOT_FOUND: int = getattr(pynvml, "NVML_ERROR_GPU_NOT_FOUND", 28)
DEVICE_GONE = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        GPU_NOT_FOUND,
    }
)
# The library cannot be used at all; retried on the next cycle.
LIBRARY_UNUSABLE = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)


@overload
def text(value: str | bytes) -> str: ...
@overload
def text(value: str | bytes | None) -> str | None: ...
def text(value: str | bytes | None) -> str | None:
    """NVML's strings: str from recent nvml-ml-py, bytes from older ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def error_name(err: pynvml.NVMLError) -> str:
    """`NVMLError_GpuIsLost` -> `GpuIsLost`: a stable label value for an NVML error."""
    if type(err) is not pynvml.NVMLError:
        return type(err).__name__.removeprefix("NVMLError_")
    # An nvidia-ml-py without a class for the code (GpuNotFound before 12.550).
    return "GpuNotFound" if err.value == GPU_NOT_FOUND else "Unknown"


class NvmlUnavailable(Exception):
    """NVML cannot be used (library missing, driver not loaded, ...)."""


class GpuGone(Exception):
    """One GPU stopped answering NVML."""

    def __init__(self, index: int, call: str, err: pynvml.NVMLError):
        self.index, self.call, self.error = index, call, error_name(err)
        super().__init__(f"GPU {index}: {call}: {err}")


@dataclass(frozen=True)
class Device:
    """One GPU as NVML enumerates it: its handle, or why it does not answer."""

    index: int
    handle: Any | None
    gone: GpuGone | None = None


class NvmlSession:
    """An initialised NVML library, shared by the GPU collector, the Xid event thread and the idle
    guard. It holds the library's state and the error policy, and nothing about the GPUs."""

    # How long a caller waits for another thread's `nvmlInit` before it counts NVML as unusable:
    # an init that hangs (a wedged driver) must not wedge every thread that touches NVML.
    INIT_WAIT_SECONDS = 1.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._initialised = False
        # (gpu index, call, error name) -> how many times; exported as a counter.
        self.call_errors: Counter[tuple[int, str, str]] = Counter()
        # The first time a call fails on a GPU with an unexpected error, for logging it once.
        self.new_errors: list[str] = []
        self.missing_functions: set[str] = set()

    def ensure_init(self) -> None:
        if not self._lock.acquire(timeout=self.INIT_WAIT_SECONDS):
            raise NvmlUnavailable("nvmlInit has not returned (another thread has been waiting on it)")
        try:
            if self._initialised:
                return
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as err:
                raise NvmlUnavailable(f"nvmlInit: {err}") from err
            self._initialised = True
        finally:
            self._lock.release()

    def devices(self, expected: int = 0) -> list[Device]:
        """Every GPU NVML counts (and up to `expected`, so that a GPU that vanished from the count
        is still reported, as gone), each with its handle or why it has none.

        The one enumeration of the agent, under the one error policy: NvmlUnavailable when the
        library cannot be used, a `gone` device when one GPU does not answer.
        """
        self.ensure_init()
        count = self.require(-1, "nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
        found = []
        for index in range(max(count, expected)):
            try:
                if index >= count:
                    missing = pynvml.NVMLError(GPU_NOT_FOUND)
                    raise GpuGone(index, "nvmlDeviceGetCount", missing)
                handle = self.require(
                    index, "nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index
                )
            except GpuGone as gone:
                found.append(Device(index, None, gone))
            else:
                found.append(Device(index, handle))
        return found

    def shutdown(self, wait: float = 2.0) -> None:
        """Release the library, unless another thread is stuck in `nvmlInit` (the process is
        leaving anyway, and waiting on a wedged driver would keep it from exiting)."""
        if not self._lock.acquire(timeout=wait):
            return
        try:
            if self._initialised:
                with contextlib.suppress(pynvml.NVMLError):  # shutting down anyway
                    pynvml.nvmlShutdown()
                self._initialised = False
        finally:
            self._lock.release()

    def reset(self) -> None:
        """Forget the initialised state after a library-level error, so the next cycle re-inits."""
        self._initialised = False

    def system(self, call: str, fn: Callable[..., T], *args: Any) -> T | None:
        """A query that concerns no GPU (driver version, device count)."""
        return self.query(-1, call, fn, *args)

    def query(self, index: int, call: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Call `fn(*args)` for GPU `index` (-1: no GPU); None when the value is absent."""
        try:
            return fn(*args)
        except pynvml.NVMLError as err:
            self.failed(index, call, err)
            return None

    def require(self, index: int, call: str, fn: Callable[..., T], *args: Any) -> T:
        """A call the GPU cannot be exported without (its handle, its UUID): any error means down."""
        try:
            return fn(*args)
        except pynvml.NVMLError as err:
            if err.value in LIBRARY_UNUSABLE:
                self.reset()
                raise NvmlUnavailable(f"{call}: {err}") from err
            raise GpuGone(index, call, err) from err

    def query_first(
        self, index: int, candidates: Sequence[tuple[str, Callable[..., T]]], *args: Any
    ) -> T | None:
        """The first of several equivalent calls that this driver has, newest first.

        Drivers older than the newest call answer `FunctionNotFound`; that is remembered for the
        process so the missing call is not tried on every cycle.
        """
        for call, fn in candidates:
            if call in self.missing_functions:
                continue
            try:
                return fn(*args)
            except pynvml.NVMLError as err:
                if err.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self.missing_functions.add(call)
                    continue
                self.failed(index, call, err)
                return None
        return None

    def failed(self, index: int, call: str, err: pynvml.NVMLError) -> None:
        """Apply the error policy to an error a caller caught itself."""
        code = err.value
        if code in DEVICE_GONE and index >= 0:
            raise GpuGone(index, call, err) from err
        if code in LIBRARY_UNUSABLE:
            self.reset()
            where = f"GPU {index}: " if index >= 0 else ""
            raise NvmlUnavailable(f"{where}{call}: {err}") from err
        if code not in ABSENT:
            self._record(index, call, err)

    def _record(self, index: int, call: str, err: pynvml.NVMLError) -> None:
        key = (index, call, error_name(err))
        if key not in self.call_errors:
            where = f"GPU {index}" if index >= 0 else "system"
            self.new_errors.append(f"{where}: {call} failed: {err}; that value is left out")
        self.call_errors[key] += 1

    def take_new_errors(self) -> list[str]:
        new, self.new_errors = self.new_errors, []
        return new
