"""What a benchmark sends: named workloads, vLLM's datasets and their files, user files, lengths, arrivals and the
vocabulary prompt ids are drawn from."""
