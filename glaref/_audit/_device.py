"""Which device the audit runs on, what it is, and how much memory it has left.

jax is imported here (inside functions) and nowhere above the audit engine; torch is never
imported: its version comes from the installed package's metadata.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
from typing import Any

from .._errors import AuditEnvironmentError


@contextlib.contextmanager
def x64_scope():
    """jax's x64 mode for the block only: the scoped ``jax.enable_x64`` where this jax has it
    (recent releases), else the global flag set and restored (older ones, down to the floor in
    pyproject.toml)."""
    jax = import_jax()
    if hasattr(jax, "enable_x64"):
        with jax.enable_x64(True):
            yield
        return
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", old)


def import_jax():
    """jax, or an environment error that says how to get it."""
    try:
        import jax  # noqa: F401
        import jax.numpy  # noqa: F401
    except ImportError as exc:
        raise AuditEnvironmentError(f"jax is not installed ({exc}); pip install 'glaref[jax]'") from None
    return jax


def select_device(backend: str | None):
    """The first device of ``backend`` ('cpu', 'gpu', ...; None: jax's default backend)."""
    jax = import_jax()
    try:
        devices = jax.devices(backend) if backend else jax.devices()
    except RuntimeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise AuditEnvironmentError(f"backend {backend!r} is not available here: {first}",
                                    argument="backend") from None
    if not devices:
        raise AuditEnvironmentError(f"backend {backend!r} has no devices", argument="backend")
    return devices[0]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_cuda(torch_version: str | None) -> str | None:
    # "2.14.1+cu130" -> "13.0"; CPU and ROCm builds -> None. torch is never imported.
    if not torch_version or "+cu" not in torch_version:
        return None
    digits = torch_version.split("+cu", 1)[1]
    if not digits.isdigit() or len(digits) < 2:
        return None
    return f"{int(digits[:-1])}.{digits[-1]}"


def cpu_model() -> str:
    """The host CPU's model name (/proc/cpuinfo), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def nvidia_smi() -> dict[str, Any]:
    """GPU name, driver and memory of the first GPU from nvidia-smi, or nulls without one."""
    out: dict[str, Any] = {"gpu": None, "driver": None, "gpu_memory_gb": None}
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return out
    try:
        r = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True,
                           timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return out
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    if r.returncode != 0 or not lines:
        return out
    fields = [f.strip() for f in lines[0].split(",")]
    if len(fields) >= 3:
        out["gpu"], out["driver"] = fields[0], fields[1]
        try:
            out["gpu_memory_gb"] = round(float(fields[2]) / 1024.0, 2)  # MiB -> GiB
        except ValueError:
            pass
    return out


def device_info(device, precision: str) -> dict[str, Any]:
    """The report's "device" block: the seed's keys, then x64, matmul precision and versions."""
    jax = import_jax()
    torch = _version("torch")
    info: dict[str, Any] = {
        "jax": jax.__version__,
        "backend": device.platform,
        "devices": [f"{d.platform}:{d.id}" for d in jax.devices(device.platform)],
        "python": platform.python_version(),
        "device_kind": device.device_kind,
        **nvidia_smi(),
        "torch": torch,
        "torch_cuda": _torch_cuda(torch),
        "jaxlib": _version("jaxlib"),
        "numpy": _version("numpy"),
        "numba": _version("numba"),
        "glaref": _version("glaref"),
        "x64": bool(jax.config.jax_enable_x64),
        "matmul_precision": precision,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    return info


def host_available_bytes() -> int | None:
    """Memory available to this process on the host (MemAvailable; None when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def available_bytes(device) -> int | None:
    """Memory the next XLA program may use on ``device`` (None when unknown)."""
    if device.platform == "cpu":
        return host_available_bytes()
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory stats
        return None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
