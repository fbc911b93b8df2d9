"""Collectors that read hardware state (NVML, sysfs) and yield metric families."""
