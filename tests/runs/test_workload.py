"""Workloads are seeded and reproducible; traces ship with the package; user files are read or refused."""

import json

import numpy as np
import pytest

from chunkbench.errors import UserError
from chunkbench.workloads.arrivals import sample_arrivals
from chunkbench.workloads.lengths import sample_lengths
from chunkbench.workloads.spec import NAMED, WorkloadSpec, build_workload, clip_to_model


@pytest.mark.parametrize("name", [*NAMED, "synthetic"])
def test_same_seed_same_requests(name):
    a = build_workload(WorkloadSpec(name=name, num_requests=50, rate=2.0, seed=7))
    b = build_workload(WorkloadSpec(name=name, num_requests=50, rate=2.0, seed=7))
    assert a == b and len(a) == 50
    assert all(r.prompt_len >= 1 and r.output_len >= 1 for r in a)
    assert [r.arrival_time for r in a] == sorted(r.arrival_time for r in a)


def test_different_seed_different_requests():
    a = build_workload(WorkloadSpec(name="chat", seed=1))
    b = build_workload(WorkloadSpec(name="chat", seed=2))
    assert a != b


def test_traces_keep_their_real_arrivals_and_lengths():
    conv = build_workload(WorkloadSpec(name="azure-conv", num_requests=3))
    assert [(r.prompt_len, r.output_len) for r in conv] == [(374, 44), (396, 109), (879, 55)]
    assert conv[1].arrival_time == pytest.approx(4.314579)
    faster = build_workload(WorkloadSpec(name="azure-conv", num_requests=3, time_scale=0.5))
    assert faster[1].arrival_time == pytest.approx(4.314579 / 2)
    assert len(build_workload(WorkloadSpec(name="azure-conv", num_requests=None))) == 19366
    assert len(build_workload(WorkloadSpec(name="azure-code", num_requests=None))) == 8819
    arxiv = build_workload(WorkloadSpec(name="arxiv-summarization", num_requests=5, rate=4.0))
    assert arxiv[0].prompt_len == 3772 and arxiv[0].arrival_time == 0.0 and arxiv[1].arrival_time > 0
    within = build_workload(WorkloadSpec(name="azure-conv", num_requests=None, duration=60))
    assert max(r.arrival_time for r in within) <= 60 and len(within) < 19366


def test_named_workloads_have_their_shapes():
    rag = build_workload(WorkloadSpec(name="rag-mix", num_requests=200))
    docs = [r for r in rag if r.prompt_len >= 2048]
    assert len(docs) == 20 and all(r.prompt_len <= 6144 for r in docs)
    long_doc = build_workload(WorkloadSpec(name="long-doc", num_requests=50))
    assert all(8192 <= r.prompt_len <= 32768 for r in long_doc)


def test_distributions_and_arrivals():
    rng = np.random.default_rng(0)
    assert set(sample_lengths("fixed:128", 10, rng)) == {128}
    u = sample_lengths("uniform:5:9", 1000, rng)
    assert u.min() == 5 and u.max() == 9
    clamped = sample_lengths("normal:100:500:20:40", 1000, rng)
    assert clamped.min() == 20 and clamped.max() == 40
    z = sample_lengths("zipf:1.5:300", 1000, rng)
    assert z.min() >= 1 and z.max() <= 300
    assert np.median(sample_lengths("lognormal:200:0.5", 4001, rng)) == pytest.approx(200, rel=0.1)
    gaps = np.diff(sample_arrivals("poisson", 20001, 4.0, 1.0, rng))
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    bursty = np.diff(sample_arrivals("gamma", 20001, 4.0, 0.25, rng))
    assert bursty.mean() == pytest.approx(0.25, rel=0.1) and bursty.std() > 1.5 * gaps.std()
    assert list(sample_arrivals("constant", 3, 2.0, 1.0, rng)) == [0.0, 0.5, 1.0]
    assert list(sample_arrivals("all-at-once", 3, 2.0, 1.0, rng)) == [0.0, 0.0, 0.0]


def test_clipping_warns_how_many():
    requests = build_workload(WorkloadSpec(name="long-doc", num_requests=10))
    with pytest.warns(UserWarning, match="10 of 10 requests were clipped to max_model_len \\(4096\\)"):
        clipped = clip_to_model(requests, 4096)
    assert all(r.prompt_len + r.output_len <= 4096 and r.output_len >= 1 for r in clipped)


def test_user_files(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("input_len,output_len,arrival_time\n100,10,5.0\n200,20,6.5\n")
    reqs = build_workload(WorkloadSpec(name=str(csv)))
    assert [(r.prompt_len, r.output_len, r.arrival_time) for r in reqs] == [(100, 10, 5.0), (200, 20, 6.5)]  # as given
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"prompt_len": 7, "output_len": 3}\n{"prompt_len": 9, "output_len": 4}\n')
    reqs = build_workload(WorkloadSpec(name=str(jsonl), arrival="constant", rate=2.0))
    assert [(r.prompt_len, r.arrival_time) for r in reqs] == [(7, 0.0), (9, 0.5)]
    sharegpt = tmp_path / "sg.json"
    sharegpt.write_text(
        json.dumps(
            [
                {
                    "id": "a",
                    "conversations": [{"from": "human", "value": "x" * 400}, {"from": "gpt", "value": "y" * 80}],
                },
                {"id": "b", "conversations": [{"from": "human", "value": "only a question"}]},
            ]
        )
    )
    reqs = build_workload(WorkloadSpec(name=str(sharegpt)))
    assert [(r.prompt_len, r.output_len) for r in reqs] == [(100, 20)]  # 4 characters per token


@pytest.mark.parametrize(
    "spec, message",
    [
        (WorkloadSpec(name="nope"), "unknown workload 'nope'"),
        (WorkloadSpec(name="chat", rate=0), "--rate must be > 0"),
        (WorkloadSpec(name="chat", rate=-1, arrival="gamma"), "--rate must be > 0"),
        (WorkloadSpec(name="/no/such/file.csv"), "no such file"),
        (WorkloadSpec(name="synthetic", prompt_len="gauss:5"), "unknown distribution 'gauss'"),
        (WorkloadSpec(name="synthetic", prompt_len="uniform:9:5"), "LO <= HI"),
        (WorkloadSpec(name="synthetic", output_len="fixed:x"), "non-numeric"),
        (WorkloadSpec(name="chat", arrival="trace"), "has no timestamps"),
        (WorkloadSpec(name="chat", num_requests=0), "--num-requests"),
    ],
)
def test_bad_workloads(spec, message):
    with pytest.raises(UserError, match=message):
        build_workload(spec)


@pytest.mark.parametrize(
    "content, message",
    [
        ("prompt_len,output_len\n10,abc\n", "non-numeric"),
        ("a,b\n1,2\n", "no prompt_len column"),
        ("prompt_len,output_len\n10,0\n", "non-positive"),
    ],
)
def test_malformed_trace_files(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        build_workload(WorkloadSpec(name=str(path)))
