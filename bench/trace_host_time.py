"""Where the host's time goes in a PyTorch profiler trace (Chrome JSON, as `--profile` writes):
the CPU operators by self time (their time less that of the operators they call) and the CUDA
runtime calls by total time, per profiled iteration.

  python trace_host_time.py TRACE.json [ITERATIONS] [TOP]
"""
import collections
import json
import sys

path = sys.argv[1]
iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 2
top = int(sys.argv[3]) if len(sys.argv) > 3 else 25
events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
ops = sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: (e["tid"], e["ts"], -e["dur"]))
self_time = collections.Counter()
calls = collections.Counter()
stack = []  # (end, name) of the enclosing operators on this thread
for e in ops:
    while stack and (stack[-1][2] != e["tid"] or stack[-1][0] <= e["ts"]):
        stack.pop()
    if stack:
        self_time[stack[-1][1]] -= e["dur"]
    self_time[e["name"]] += e["dur"]
    calls[e["name"]] += 1
    stack.append((e["ts"] + e["dur"], e["name"], e["tid"]))
runtime = collections.Counter()
runtime_calls = collections.Counter()
for e in events:
    if e.get("cat") == "cuda_runtime":
        runtime[e["name"]] += e["dur"]
        runtime_calls[e["name"]] += 1
print(f"host self time per iteration (ms), {sum(self_time.values()) / 1e3 / iterations:.2f} ms of operators in all")
for name, us in self_time.most_common(top):
    print(f"  {us / 1e3 / iterations:8.3f}  {calls[name] // iterations:6d}  {name}")
print(f"CUDA runtime calls per iteration (ms), {sum(runtime.values()) / 1e3 / iterations:.2f} ms in all")
for name, us in runtime.most_common(12):
    print(f"  {us / 1e3 / iterations:8.3f}  {runtime_calls[name] // iterations:6d}  {name}")
