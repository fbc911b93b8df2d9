"""The clusterhealth daemon: configuration, sampling, HTTP server and command line."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("clusterhealth")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
