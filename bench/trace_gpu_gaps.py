"""Where the GPU waits in a PyTorch profiler trace (Chrome JSON, as `--profile` writes): the
kernels' busy time (their union) against the span from the first kernel's start to the last's
end, and the longest idle gaps between kernels with the kernels on either side. A decode step
whose span is much longer than its busy time is waiting on launches or the host, not on memory.

  python trace_gpu_gaps.py TRACE.json [ITERATIONS] [TOP]
"""
import collections
import json
import sys

path = sys.argv[1]
iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 2
top = int(sys.argv[3]) if len(sys.argv) > 3 else 12
events = json.load(open(path))["traceEvents"]
kernels = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda e: e["ts"])
if not kernels:
    sys.exit("trace_gpu_gaps: no kernels in " + path)
span = max(e["ts"] + e["dur"] for e in kernels) - kernels[0]["ts"]
busy = 0.0
gaps = []  # (idle us, kernel before, kernel after)
end = kernels[0]["ts"]
before = "(start)"
for e in kernels:
    if e["ts"] > end:
        gaps.append((e["ts"] - end, before, e["name"]))
    busy += max(0.0, e["ts"] + e["dur"] - max(end, e["ts"]))
    if e["ts"] + e["dur"] > end:
        end = e["ts"] + e["dur"]
        before = e["name"]
idle = span - busy
print(f"GPU per iteration: span {span / 1e3 / iterations:.3f} ms, busy {busy / 1e3 / iterations:.3f} ms "
      f"({100 * busy / span:.1f}%), idle {idle / 1e3 / iterations:.3f} ms in {len(gaps) // iterations} gaps, "
      f"{len(kernels) // iterations} kernels and copies")
sizes = collections.Counter()
for us, _, _ in gaps:
    sizes["< 2 us" if us < 2 else "2-5 us" if us < 5 else "5-20 us" if us < 20 else ">= 20 us"] += us
print("  idle by gap size (ms per iteration): " +
      ", ".join(f"{k} {v / 1e3 / iterations:.3f}" for k, v in sorted(sizes.items())))
print(f"  the {top} longest gaps (us, kernel before -> kernel after):")
for us, a, b in sorted(gaps, reverse=True)[:top]:
    print(f"  {us:8.1f}  {a[:60]} -> {b[:60]}")
