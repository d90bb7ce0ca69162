"""Container env the way the kubelet writes it, for tests and benchmarks of large requests.

With service links on (the default), the kubelet gives every container seven variables per
Service of its namespace; a namespace with a few hundred Services makes a CreateContainer
request of tens of KiB, thousands of them a MiB.
"""

from __future__ import annotations

from typing import List, Tuple


def service_link_env(total_bytes: int, salt: str = "SVC") -> List[Tuple[str, str]]:
    """(key, value) pairs of service links until keys and values hold ``total_bytes``."""
    env: List[Tuple[str, str]] = []
    size, k = 0, 0
    while size < total_bytes:
        name = f"{salt}_BACKEND_{k:05d}"
        ip = f"10.{(k >> 16) & 255}.{(k >> 8) & 255}.{k & 255}"
        for key, value in ((f"{name}_SERVICE_HOST", ip), (f"{name}_SERVICE_PORT", "8080"),
                           (f"{name}_PORT", f"tcp://{ip}:8080"), (f"{name}_PORT_8080_TCP", f"tcp://{ip}:8080"),
                           (f"{name}_PORT_8080_TCP_PROTO", "tcp"), (f"{name}_PORT_8080_TCP_PORT", "8080"),
                           (f"{name}_PORT_8080_TCP_ADDR", ip)):
            env.append((key, value))
            size += len(key) + len(value)
        k += 1
    return env
