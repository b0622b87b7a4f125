"""Loaded by every Python process started with this folder on PYTHONPATH (scripts/vllm_step_log.py puts it on
the server's): when vLLM's engine core module is imported, its EngineCore.step is wrapped to append one line per
step that computed tokens to $VLLM_STEP_LOG/steps-<pid>.tsv: start and end (time.perf_counter, s), tokens,
requests, minor page faults, user and system CPU time (ms) and the process's resident memory after it (MB)."""

import importlib.abc
import importlib.machinery
import os
import resource
import sys
import time

ENGINE_CORE = "vllm.v1.engine.core"


def wrap(module) -> None:
    engine_core = module.EngineCore
    step = engine_core.step
    out = []  # the log, opened at the first step (the API server imports this module too, and steps nothing)

    def logged_step(self):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        schedule = self.scheduler.schedule
        scheduled = []
        self.scheduler.schedule = lambda *a, **k: scheduled.append(schedule(*a, **k)) or scheduled[-1]
        try:
            result = step(self)
        finally:
            self.scheduler.schedule = schedule
        end, after = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        if scheduled and scheduled[0].total_num_scheduled_tokens:
            with open("/proc/self/statm") as statm:
                rss_mb = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
            output = scheduled[0]
            fields = (f"{start:.6f}", f"{end:.6f}", output.total_num_scheduled_tokens, len(output.num_scheduled_tokens),
                      after.ru_minflt - before.ru_minflt, f"{1e3 * (after.ru_utime - before.ru_utime):.1f}",
                      f"{1e3 * (after.ru_stime - before.ru_stime):.1f}", f"{rss_mb:.0f}")
            if not out:
                path = os.path.join(os.environ["VLLM_STEP_LOG"], f"steps-{os.getpid()}.tsv")
                out.append(open(path, "w", buffering=1))
            out[0].write("\t".join(map(str, fields)) + "\n")
        return result

    engine_core.step = logged_step


class WrapOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != ENGINE_CORE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            execute = spec.loader.exec_module
            spec.loader.exec_module = lambda module: (execute(module), wrap(module))
        return spec


if os.environ.get("VLLM_STEP_LOG"):
    sys.meta_path.insert(0, WrapOnImport())
