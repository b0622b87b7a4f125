"""Loaded by every Python process started with this folder on PYTHONPATH (scripts/vllm_step_log.py puts it on
the server's): when vLLM's engine core module is imported, its EngineCore.step is wrapped to append one line per
step that computed tokens to $VLLM_STEP_LOG/steps-<pid>.tsv: start and end (time.perf_counter, s), tokens,
requests, minor page faults, user and system CPU time (ms), the process's resident memory after it (MB), then
the step's shape: its first chunks' tokens (prompts with nothing computed before), its prefill chunks' causal
attention pairs (query x context + query x (query + 1) / 2; a chunk of more than one token is a prefill) and its
decodes."""

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
            computed = {r.req_id: r.num_computed_tokens for r in output.scheduled_new_reqs}
            cached = output.scheduled_cached_reqs
            computed.update(zip(cached.req_ids, cached.num_computed_tokens))
            chunks = [(q, computed.get(rid, 0)) for rid, q in output.num_scheduled_tokens.items()]
            first = sum(q for q, context in chunks if q > 1 and context == 0)
            pairs = sum(q * context + q * (q + 1) // 2 for q, context in chunks if q > 1)
            decodes = sum(q == 1 for q, _ in chunks)
            fields = (
                f"{start:.6f}",
                f"{end:.6f}",
                output.total_num_scheduled_tokens,
                len(output.num_scheduled_tokens),
                after.ru_minflt - before.ru_minflt,
                f"{1e3 * (after.ru_utime - before.ru_utime):.1f}",
                f"{1e3 * (after.ru_stime - before.ru_stime):.1f}",
                f"{rss_mb:.0f}",
                first,
                pairs,
                decodes,
            )
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
