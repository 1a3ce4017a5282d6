"""CUDA as a workload sees it, through the driver API (libcuda via ctypes; no torch, no toolkit).

Run on the target as ``python3 - SIZE...`` with this file on stdin (stdlib only, Python 3.6+,
so it runs in any guest that has python3). Prints one JSON object:

- ``libcuda``: the file the loader resolved (its name carries the userspace driver version);
- ``init``: cuInit's result name ("CUDA_SUCCESS", "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", ...);
- ``driver_api``: cuDriverGetVersion (e.g. 13000); ``devices``: [{"bdf", "name"}] in CUDA order;
- ``copies``: for every ordered pair of devices, and each device with itself, whether the driver
  lets them map each other (``peer``) and, per size, whether a random buffer copied from one to
  the other with cuMemcpyPeer came back byte for byte (``ok``, first differing offset).

The copy check exists because P2P failed on a real host as silent data corruption (SEV-SNP with
translated IOMMU domains), not as an error: a capability flag would have said "OK".
"""

import ctypes
import json
import os
import sys

SUCCESS = 0
PEER_ALREADY_ENABLED = 704


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


def copy_check(cu, src, dst, sizes, buffers):
    """Copy the random buffer src -> dst device by cuMemcpyPeer and read it back, per size."""
    result = {"from": src["bdf"], "to": dst["bdf"], "peer": None, "sizes": []}
    if src is not dst:
        can = ctypes.c_int()
        cu.call("cuDeviceCanAccessPeer", ctypes.byref(can), src["_dev"], dst["_dev"])
        result["peer"] = bool(can.value)
        if can.value:
            cu.call("cuCtxSetCurrent", src["_ctx"])
            rc = cu.lib.cuCtxEnablePeerAccess(dst["_ctx"], 0)
            if rc not in (SUCCESS, PEER_ALREADY_ENABLED):
                raise CudaError("cuCtxEnablePeerAccess", result_name(cu.lib, rc))
    for size in sizes:
        a, b = ctypes.c_uint64(), ctypes.c_uint64()
        cu.call("cuCtxSetCurrent", src["_ctx"])
        cu.call("cuMemAlloc_v2", ctypes.byref(a), size)
        cu.call("cuCtxSetCurrent", dst["_ctx"])
        cu.call("cuMemAlloc_v2", ctypes.byref(b), size)
        try:
            ctypes.memset(buffers.back, 0, size)
            cu.call("cuCtxSetCurrent", src["_ctx"])
            cu.call("cuMemcpyHtoD_v2", a.value, buffers.src, size)
            cu.call("cuMemcpyPeer", b.value, dst["_ctx"], a.value, src["_ctx"], size)
            cu.call("cuCtxSynchronize")
            cu.call("cuCtxSetCurrent", dst["_ctx"])
            cu.call("cuMemcpyDtoH_v2", buffers.back, b.value, size)
            first = buffers.first_difference(size)
            result["sizes"].append({"bytes": size, "ok": first is None, "first_bad_offset": first})
        finally:
            cu.call("cuCtxSetCurrent", src["_ctx"])
            cu.lib.cuMemFree_v2(a.value)
            cu.call("cuCtxSetCurrent", dst["_ctx"])
            cu.lib.cuMemFree_v2(b.value)
    return result


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
        for src in found:
            for dst in found:
                out["copies"].append(copy_check(cu, src, dst, sizes, buffers))
    except CudaError as exc:
        out["error"] = str(exc)
    return out


if __name__ == "__main__":
    print(json.dumps(probe([int(arg) for arg in sys.argv[1:]])))
