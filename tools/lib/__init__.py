"""What the commands in ``tools/`` share: paths, tritonserver and its processes, perf_analyzer,
the benchmark harness, the peers, example, real and timed models, the client. Nothing here is a
command, and no command imports another command."""
