"""CUDA as a workload sees it, through the driver API (libcuda via ctypes; no torch, no toolkit).

Run on the target as ``python3 - SIZE...`` with this file on stdin (stdlib only, Python 3.6+,
so it runs in any guest that has python3). Prints one JSON object:

- ``libcuda``: the file the loader resolved (its name carries the userspace driver version);
- ``init``: cuInit's result name ("CUDA_SUCCESS", "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", ...);
- ``driver_api``: cuDriverGetVersion (e.g. 13000); ``devices``: [{"bdf", "name"}] in CUDA order;
- ``copies``: for every ordered pair of devices, and each device with itself: whether the driver
  lets the first map the second (``peer``, cuDeviceCanAccessPeer); what enabling peer access
  answered in each direction (``enable``: [from -> to, to -> from] result names, None where not
  capable); per size, whether a random buffer copied with cuMemcpyPeer came back byte for byte
  (``ok``, first differing offset); the copy's bandwidth at the largest size (``gbps``), the same
  copy measured before peer access was enabled, which the driver stages through host memory
  (``staged_gbps``), and ``host_staged``: the copy ran no faster than that, so peer access was not
  really used; ``error``: a CUDA error that stopped this pair (the other pairs still run).

Peer access is enabled in both directions before a pair's copies and disabled after them, so the
probe itself never holds more than one pair's peer connections: a refusal such as
CUDA_ERROR_TOO_MANY_PEERS ("the hardware resources required to enable peer access have been
exhausted", cuda.h; the runtime's cudaErrorTooManyPeers) is this pair's result, not the probe's end.

The copy check exists because P2P failed on a real host as silent data corruption (SEV-SNP with
translated IOMMU domains), not as an error: a capability flag would have said "OK". The
bandwidth check exists because a copy between devices always arrives, P2P or not: the CUDA
programming guide says that only with peer access enabled does a peer copy "no longer need to be
staged through the host", so speed is what shows that P2P carried it.
"""

import ctypes
import json
import os
import sys
import time

SUCCESS = 0
PEER_ALREADY_ENABLED = 704
TIMED_MIN = 1 << 20  # below a MiB a copy's time is its latency: no bandwidth is judged
REPEATS = 5  # the best of these: one preempted copy does not make a pair look staged
STAGED_RATIO = 1.2  # a peer copy must beat the host-staged one by this much to count as P2P


def result_name(cuda, rc):
    name = ctypes.c_char_p()
    if cuda.cuGetErrorName(rc, ctypes.byref(name)) == SUCCESS and name.value:
        return name.value.decode()
    return f"CUDA_ERROR_{rc}"


def loaded_path(fragment):
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split(None, 5)[-1].strip()
            if fragment in os.path.basename(path):
                return os.path.realpath(path)
    return None


class Cuda:
    def __init__(self, lib):
        self.lib = lib
        u64, ptr = ctypes.c_uint64, ctypes.c_void_p
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), ctypes.c_size_t]
        lib.cuMemcpyPeer.argtypes = [u64, ptr, u64, ptr, ctypes.c_size_t]
        lib.cuMemcpyHtoD_v2.argtypes = [u64, ptr, ctypes.c_size_t]
        lib.cuMemcpyDtoH_v2.argtypes = [ptr, u64, ctypes.c_size_t]
        lib.cuMemFree_v2.argtypes = [u64]
        lib.cuCtxSetCurrent.argtypes = [ptr]
        lib.cuCtxEnablePeerAccess.argtypes = [ptr, ctypes.c_uint]
        lib.cuCtxDisablePeerAccess.argtypes = [ptr]

    def call(self, fn, *args):
        rc = getattr(self.lib, fn)(*args)
        if rc != SUCCESS:
            raise CudaError(fn, result_name(self.lib, rc))


class CudaError(Exception):
    def __init__(self, fn, name):
        super().__init__(f"{fn}: {name}")
        self.fn, self.name = fn, name


def normal_bdf(bus_id):
    domain, rest = bus_id.lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def devices(cu):
    count = ctypes.c_int()
    cu.call("cuDeviceGetCount", ctypes.byref(count))
    found = []
    for ordinal in range(count.value):
        dev = ctypes.c_int()
        cu.call("cuDeviceGet", ctypes.byref(dev), ordinal)
        bus = ctypes.create_string_buffer(64)
        cu.call("cuDeviceGetPCIBusId", bus, 64, dev)
        name = ctypes.create_string_buffer(256)
        cu.call("cuDeviceGetName", name, 256, dev)
        ctx = ctypes.c_void_p()
        cu.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        found.append(
            {
                "bdf": normal_bdf(bus.value.decode()),
                "name": name.value.decode(),
                "_dev": dev.value,
                "_ctx": ctx,
            }
        )
    return found


class Buffers:
    """Host buffers made once: the random source and the read-back, compared with memcmp
    (no Python copies of large buffers)."""

    def __init__(self, size):
        self.size = size
        self.src = ctypes.create_string_buffer(os.urandom(size), size) if size else None
        self.back = ctypes.create_string_buffer(size) if size else None
        libc = ctypes.CDLL(None)
        self.memcmp = libc.memcmp
        self.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]

    def first_difference(self, size):
        """Offset of the first byte that differs in the first ``size`` bytes, or None."""
        a, b = ctypes.addressof(self.back), ctypes.addressof(self.src)
        if self.memcmp(a, b, size) == 0:
            return None
        chunk = 4096
        for off in range(0, size, chunk):
            n = min(chunk, size - off)
            if self.memcmp(a + off, b + off, n) != 0:
                got = ctypes.string_at(a + off, n)
                want = ctypes.string_at(b + off, n)
                return off + next(i for i in range(n) if got[i] != want[i])
        return None


def can_access(cu, dev, peer):
    can = ctypes.c_int()
    cu.call("cuDeviceCanAccessPeer", ctypes.byref(can), dev["_dev"], peer["_dev"])
    return bool(can.value)


def enable_peer(cu, dev, peer):
    """Let dev's context map peer's memory; the result's name (already enabled counts as done)."""
    cu.call("cuCtxSetCurrent", dev["_ctx"])
    rc = cu.lib.cuCtxEnablePeerAccess(peer["_ctx"], 0)
    return "CUDA_SUCCESS" if rc in (SUCCESS, PEER_ALREADY_ENABLED) else result_name(cu.lib, rc)


def copy_gbps(cu, dst, dptr, src, sptr, size, repeats=REPEATS):
    """Best of ``repeats`` timed cuMemcpyPeer src -> dst, both contexts synchronised, in GB/s."""
    best = None
    for _ in range(repeats):
        cu.call("cuCtxSetCurrent", src["_ctx"])
        start = time.perf_counter()
        cu.call("cuMemcpyPeer", dptr, dst["_ctx"], sptr, src["_ctx"], size)
        cu.call("cuCtxSynchronize")
        cu.call("cuCtxSetCurrent", dst["_ctx"])
        cu.call("cuCtxSynchronize")
        took = time.perf_counter() - start
        best = took if best is None else min(best, took)
    return round(size / max(best, 1e-9) / 1e9, 2)


def intact(cu, src, sptr, dst, dptr, size, buffers):
    """Copy the random buffer src -> dst and read it back: (ok, first bad offset)."""
    ctypes.memset(buffers.back, 0, size)
    cu.call("cuCtxSetCurrent", src["_ctx"])
    cu.call("cuMemcpyHtoD_v2", sptr, buffers.src, size)
    cu.call("cuMemcpyPeer", dptr, dst["_ctx"], sptr, src["_ctx"], size)
    cu.call("cuCtxSynchronize")
    cu.call("cuCtxSetCurrent", dst["_ctx"])
    cu.call("cuMemcpyDtoH_v2", buffers.back, dptr, size)
    first = buffers.first_difference(size)
    return {"bytes": size, "ok": first is None, "first_bad_offset": first}


def alloc(cu, dev, size):
    ptr = ctypes.c_uint64()
    cu.call("cuCtxSetCurrent", dev["_ctx"])
    cu.call("cuMemAlloc_v2", ctypes.byref(ptr), size)
    return ptr.value


def pair_check(cu, a, b, sizes, buffers):
    """Both directions between a and b (or a with itself): records for (a, b) and (b, a)."""
    same = a is b
    ends = [(a, b)] if same else [(a, b), (b, a)]
    records = {}
    for src, dst in ends:
        records[(src["bdf"], dst["bdf"])] = {
            "from": src["bdf"],
            "to": dst["bdf"],
            "peer": None,
            "enable": None,
            "sizes": [],
            "gbps": None,
            "staged_gbps": None,
            "host_staged": None,
            "error": None,
        }
    size = max(sizes) if sizes else 0
    timed = size >= TIMED_MIN
    ptrs, enabled, capable = [], [], False  # ptrs [on a, on b]: for a with itself, two on a
    try:
        if size:
            ptrs = [(a, alloc(cu, a, size))]
            ptrs.append((b, alloc(cu, b, size)))
        where = {(a["bdf"], b["bdf"]): (0, 1), (b["bdf"], a["bdf"]): (1, 0)}
        if not same:
            can = {(x["bdf"], y["bdf"]): can_access(cu, x, y) for x, y in ends}
            capable = any(can.values())
            if timed and capable:  # the reference: no peer access yet, so the driver stages
                for src, dst in ends:
                    s_at, d_at = where[(src["bdf"], dst["bdf"])]
                    records[(src["bdf"], dst["bdf"])]["staged_gbps"] = copy_gbps(
                        cu, dst, ptrs[d_at][1], src, ptrs[s_at][1], size
                    )
            answers = {}
            for x, y in ends:
                if can[(x["bdf"], y["bdf"])]:
                    answers[(x["bdf"], y["bdf"])] = enable_peer(cu, x, y)
                    if answers[(x["bdf"], y["bdf"])] == "CUDA_SUCCESS":
                        enabled.append((x, y))
            for src, dst in ends:
                record = records[(src["bdf"], dst["bdf"])]
                record["peer"] = can[(src["bdf"], dst["bdf"])]
                record["enable"] = [
                    answers.get((src["bdf"], dst["bdf"])),
                    answers.get((dst["bdf"], src["bdf"])),
                ]
        for src, dst in ends:
            record = records[(src["bdf"], dst["bdf"])]
            s_at, d_at = where[(src["bdf"], dst["bdf"])] if size else (None, None)
            for n in sizes:
                record["sizes"].append(
                    intact(cu, src, ptrs[s_at][1], dst, ptrs[d_at][1], n, buffers)
                )
            if timed:  # without peer capability the copy is staged anyway: once is enough
                record["gbps"] = copy_gbps(
                    cu,
                    dst,
                    ptrs[d_at][1],
                    src,
                    ptrs[s_at][1],
                    size,
                    REPEATS if same or capable else 1,
                )
            if timed and capable:
                record["host_staged"] = record["gbps"] < STAGED_RATIO * record["staged_gbps"]
    except CudaError as exc:
        for record in records.values():
            record["error"] = str(exc)
    finally:
        for x, y in enabled:  # the next pair starts from none, and the probe holds no slots
            cu.lib.cuCtxSetCurrent(x["_ctx"])
            cu.lib.cuCtxDisablePeerAccess(y["_ctx"])
        for dev, ptr in ptrs:
            cu.lib.cuCtxSetCurrent(dev["_ctx"])
            cu.lib.cuMemFree_v2(ptr)
    return records


def probe(sizes):
    out = {
        "libcuda": None,
        "init": None,
        "driver_api": None,
        "devices": [],
        "copies": [],
        "error": None,
    }
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        out["error"] = f"libcuda.so.1 cannot be loaded: {exc}"
        return out
    out["libcuda"] = loaded_path("libcuda.so")
    rc = lib.cuInit(0)
    out["init"] = result_name(lib, rc)
    version = ctypes.c_int()
    if lib.cuDriverGetVersion(ctypes.byref(version)) == SUCCESS:
        out["driver_api"] = version.value
    if rc != SUCCESS:
        return out
    cu = Cuda(lib)
    try:
        found = devices(cu)
        out["devices"] = [{"bdf": d["bdf"], "name": d["name"]} for d in found]
        buffers = Buffers(max(sizes) if sizes else 0)
        records = {}
        for i, a in enumerate(found):
            for b in found[i:]:
                records.update(pair_check(cu, a, b, sizes, buffers))
        out["copies"] = [records[(src["bdf"], dst["bdf"])] for src in found for dst in found]
    except CudaError as exc:
        out["error"] = str(exc)
    return out


if __name__ == "__main__":
    print(json.dumps(probe([int(arg) for arg in sys.argv[1:]])))
