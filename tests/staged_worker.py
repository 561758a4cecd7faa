"""The staged-path protocol worker shared by tests/test_ofi_staged.py
(``ofi-staged``) and tests/test_nbrhd_landed.py (``nbrhd-landed``): host
segments sent through landing zones (GEXMK_*_STAGE=all) so that every step
runs without a GPU -- chunked puts and gets across slot reuse, NB and NBI
forms, local buffers inside the segment, atomics under contention (exact
counts), put_signal + wait_until, out-of-segment refusal, per-path counters,
and the refusal of staged paths (GEXMK_STAGED=refuse)."""


def staged_worker(path, transport, chunk_var):
    """The worker's source for the path ``path`` of transport ``transport``,
    whose landing chunk is set by the environment variable ``chunk_var``."""
    head = f"PATH, TRANSPORT, CHUNK_VAR = {path!r}, {transport!r}, {chunk_var!r}\n"
    return head + _BODY


_BODY = r'''
import numpy as np
P = lambda *a: pattern(*a).tobytes()
if os.environ.get("GX_MIXED_CHUNKS"):       # ranks with different landing chunk sizes
    os.environ[CHUNK_VAR] = ("64K", "96K")[int(os.environ["GEXMK_RANK"]) % 2]
c = gexmk.init()
tm = c.tm
me, n = tm.rank, tm.size
right, left = (me + 1) % n, (me - 1) % n
S = 4 << 20
seg = c.segment_attach(S)
mem = np.asarray(seg)
tr = c.transports[TRANSPORT]
refuse = os.environ.get("GEXMK_STAGED") == "refuse"
if refuse:
    assert tm.paths(right)["rma"] == "refused:" + PATH, tm.paths(right)
    e = expect_raises(E.UnsupportedError, tm.put, right, tm.addr(right, 0), b"x")
    assert PATH in str(e), e
    tm.barrier()
    c.finalize()
    print("OK", me, flush=True)
    raise SystemExit(0)
assert tm.paths(right) == {"rma": PATH, "atomic": PATH}, tm.paths(right)
# sizes across the 64 KiB chunks and 3 slots: one byte, part of a chunk, whole
# chunks, slot reuse, an odd tail
sizes = [1, 8, 4095, 65536, 3 * 65536 + 17, (1 << 20) + 12345]
offs = []
o = 0
for sz in sizes:
    offs.append(o)
    o += (sz + 4096) & ~4095
mem[:] = 0
mem[2 << 20:] = np.frombuffer(P(S - (2 << 20), me, 99), np.uint8)   # what peers get
tm.barrier()
for sz, off in zip(sizes, offs):
    tm.put(right, tm.addr(right, off), P(sz, me, sz))
tm.barrier()
for sz, off in zip(sizes, offs):
    assert bytes(mem[off:off + sz]) == P(sz, left, sz), (sz, off)
tm.barrier()                      # before the left neighbour's next puts overlap these
want = P(S - (2 << 20), right, 99)
for sz, off in zip(sizes, offs):
    got = np.zeros(sz, np.uint8)
    tm.get(got, right, tm.addr(right, (2 << 20) + off))
    assert bytes(got) == want[off:off + sz], ("get", sz, off)
# NB and NBI forms (complete at issue on this path; their events and syncs still work)
ev = tm.put_nb(right, tm.addr(right, 1 << 20), P(200000, me, 1))
ev.wait()
tm.put_nbi(right, tm.addr(right, 1600000), P(70000, me, 2))
gexmk.nbi_wait(gexmk.EC_PUT)
got = np.zeros(100000, np.uint8)
tm.get_nb(got, right, tm.addr(right, (2 << 20) + 5)).wait()
assert bytes(got) == want[5:100005]
tm.barrier()
assert bytes(mem[1 << 20:(1 << 20) + 200000]) == P(200000, left, 1)
assert bytes(mem[1600000:1670000]) == P(70000, left, 2)
# local buffers inside my own segment (the network path: through the endpoint's bounce slots)
tm.barrier()
tm.put(right, tm.addr(right, 1700000), (seg.address + (2 << 20), 300000))
tm.barrier()
assert bytes(mem[1700000:2000000]) == P(S - (2 << 20), left, 99)[:300000], "put from the segment"
tm.barrier()
tm.get((seg.address + 1700000, 250000), right, tm.addr(right, (2 << 20) + 1000))
assert bytes(mem[1700000:1950000]) == want[1000:251000], "get into the segment"
# atomics run by the owner's lander: exact under contention from every rank
ad = tm.ad_create(gexmk.DT_I64, gexmk.OP_FADD | gexmk.OP_GET | gexmk.OP_FCAS)
tm.barrier()
for _ in range(200):
    ad.op(0, tm.addr(0, 8), gexmk.OP_FADD, me + 1)
tm.barrier()
total = ad.op(0, tm.addr(0, 8), gexmk.OP_GET)
assert total == 200 * n * (n + 1) // 2, total
tm.barrier()
if me == 0:
    assert ad.op(right, tm.addr(right, 16), gexmk.OP_FCAS, 0, 42) == 0
    assert ad.op(right, tm.addr(right, 16), gexmk.OP_FCAS, 0, 43) == 42
ad.destroy()
# put_signal: the data lands before the signal, through the same ring
sig = tm.addr(me, 64)
for k in range(1, 4):
    tm.put_signal(right, tm.addr(right, 4096 * 8), P(150000, me, k), tm.addr(right, 64), k)
    tm.wait_until(sig, gexmk.CMP_EQ, k, timeout=20)
    assert bytes(mem[4096 * 8:4096 * 8 + 150000]) == P(150000, left, k), k
    tm.barrier()                  # before the left neighbour's next round overwrites it
# out of the segment: refused before anything is sent
expect_raises(E.BoundsError, tm.put, right, tm.addr(right, S - 4), b"12345678")
st = tm.path_stats(right)
assert set(st) == {PATH}, st
assert st[PATH]["put"]["ops"] >= len(sizes) + 2 and st[PATH]["get"]["ops"] >= len(sizes) + 1, st
landed = tr.landed
assert landed > 0, landed
tm.barrier()
c.finalize()
print("OK", me, landed, flush=True)
'''
