"""GPU figures of a launched trial through NVML (`pip install chunkbench[nvml]`, nvidia-ml-py): the slot's
GPUs sampled every SAMPLE_S while its server runs, as peak memory, mean utilisation and mean power. Without
NVML, or without --gpus, there is nothing to read and `unavailable()` says why."""

from __future__ import annotations

import threading

SAMPLE_S = 0.5


def _nvml():
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def unavailable() -> str | None:
    """Why no GPU figures can be read here, or None when NVML answers."""
    nvml = _nvml()
    if nvml is None:
        return "nvidia-ml-py is not installed (pip install 'chunkbench[nvml]')"
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 -- NVMLError and its many subclasses: no driver, no device
        return f"NVML did not start: {exc}"
    return None


class GpuMonitor:
    """Samples the given GPUs (NVML indices) in a thread between start() and stop(); figures() after."""

    def __init__(self, gpus: tuple[int, ...]) -> None:
        self.gpus, self.samples = gpus, []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="gpu-monitor")

    @classmethod
    def maybe(cls, gpus: tuple[int, ...]) -> GpuMonitor | None:
        if not gpus or unavailable() is not None:
            return None
        monitor = cls(gpus)
        monitor.thread.start()
        return monitor

    def _run(self) -> None:
        nvml = _nvml()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in self.gpus]
        while True:
            memory = sum(nvml.nvmlDeviceGetMemoryInfo(h).used for h in handles) / 2**20
            util = sum(nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles) / len(handles)
            power = sum(nvml.nvmlDeviceGetPowerUsage(h) for h in handles) / 1000  # mW -> W
            self.samples.append((memory, util, power))
            if self.stopped.wait(SAMPLE_S):
                return

    def stop(self) -> dict:
        """Stop sampling; the figures (empty when no sample was taken)."""
        self.stopped.set()
        self.thread.join(timeout=5)
        if not self.samples:
            return {}
        memory, util, power = zip(*self.samples)
        return {
            "gpu_peak_memory_mib": max(memory),
            "gpu_mean_util_pct": sum(util) / len(util),
            "gpu_mean_power_w": sum(power) / len(power),
        }
