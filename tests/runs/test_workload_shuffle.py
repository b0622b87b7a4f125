"""WorkloadSpec.shuffle: a trace file takes its first num_requests rows by default; shuffled, a seeded
sample of rows, put back in time order."""

from chunkbench.workloads.spec import WorkloadSpec, build_workload


def test_a_trace_takes_its_first_rows_unless_shuffled(tmp_path):
    path = tmp_path / "trace.csv"
    rows = "".join(f"{10 + i},{i + 1},{i * 0.5}\n" for i in range(20))  # output_len i + 1 at 0.5 * i s
    path.write_text("prompt_len,output_len,arrival_time\n" + rows)

    def outputs(**kw):
        return [r.output_len for r in build_workload(WorkloadSpec(name=str(path), num_requests=5, **kw))]

    assert outputs() == [1, 2, 3, 4, 5]
    shuffled = outputs(shuffle=True, seed=1)
    assert shuffled != [1, 2, 3, 4, 5] and shuffled == outputs(shuffle=True, seed=1)  # seeded
    assert shuffled == sorted(shuffled) and shuffled != outputs(shuffle=True, seed=2)  # time order kept
    arrivals = [
        r.arrival_time for r in build_workload(WorkloadSpec(name=str(path), num_requests=5, shuffle=True, seed=1))
    ]
    assert arrivals == [0.5 * (o - 1) for o in shuffled]  # the trace's own times, as given (vLLM's timed_trace)
