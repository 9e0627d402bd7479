"""Test set-up: 8 CPU devices for sharding tests, float32, no GPU probing."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
