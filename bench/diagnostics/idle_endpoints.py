"""What a process's progress thread costs while it does nothing, and how fast it
serves a peer's gets, as the process holds more endpoints (issue 21).

Run as a 2-rank job over the network transport, e.g.::

    NEP=8 GEXMK_TRANSPORT=ofi GEXMK_OFI_PROVIDER='tcp;ofi_rxm' \\
        python -P -m gexmk.run -n 2 bench/diagnostics/idle_endpoints.py

Each rank opens NEP endpoints besides the primordial one (and the hidden sync one).
Rank 1 idles 1.5 s in Python (a ``time.sleep`` loop), then waits in ``tm.barrier()``
while rank 0 issues 300 blocking 8 B gets to it (a 10 ms pause after every 50, so that
some gets find it quiet).  Printed: rank 1's process CPU time (all threads) over each
phase in % of one core, and the gets' median and p90.  The progress thread sleeps in
the CQ fds of at most SLEEP_EPS endpoints (ofi.pyx); beyond that, and over shm (no
wait object), it polls with 20 us naps (bench/README.md, "Many endpoints").  Timings
are printed, never asserted."""
import os
import time

import numpy as np

import gexmk

NEP = int(os.environ.get("NEP", "0"))
c = gexmk.init()
eps = [c.ep_create() for _ in range(NEP)]
seg = c.segment_attach(1 << 16)
tm = c.tm
tm.barrier()


def cpu_idle(secs):
    t0, p0 = time.perf_counter(), time.process_time()
    end = t0 + secs
    while time.perf_counter() < end:
        time.sleep(0.05)
    return 100 * (time.process_time() - p0) / (time.perf_counter() - t0)


if tm.rank == 1:
    idle = cpu_idle(1.5)
    t0, p0 = time.perf_counter(), time.process_time()
    tm.barrier()       # rank 0 measures the gets meanwhile, then joins
    bar = 100 * (time.process_time() - p0) / (time.perf_counter() - t0)
    print(f"rank 1: {NEP + 2} endpoints, idle in Python {idle:.1f} % of a core, "
          f"in the barrier (serving) {bar:.1f} %", flush=True)
else:
    time.sleep(2.0)
    x = np.zeros(1, np.uint64)
    lat = []
    for i in range(300):
        t = time.perf_counter_ns()
        tm.get(x, 1, tm.addr(1, 0))
        lat.append(time.perf_counter_ns() - t)
        if i % 50 == 49:
            time.sleep(0.01)
    lat.sort()
    print(f"rank 0: 8 B get to rank 1 (in its barrier): median {lat[150] / 1e3:.1f} us, "
          f"p90 {lat[270] / 1e3:.1f} us", flush=True)
    time.sleep(1.0)
    tm.barrier()
tm.barrier()
c.finalize()
