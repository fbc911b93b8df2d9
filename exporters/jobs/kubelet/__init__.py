"""The kubelet's pod-resources API (v1): its vendored api.proto and the code generated from it."""
