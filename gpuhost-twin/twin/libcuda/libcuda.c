/* gpuhost twin: a stand-in for NVIDIA's libcuda.so (the CUDA driver API's userspace half).
 *
 * It answers as the real library would on the twin's simulated hardware. Like the real one it
 * opens the device nodes (/dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia<minor>), so the kernel's
 * device controller decides what a container may use: EPERM/EACCES = denied; ENXIO/ENODEV =
 * allowed (no real driver behind the node on a CI machine). What the real library learns from
 * the kernel driver through ioctls (version, GPUs and minors, UVM, P2P capability, whether P2P
 * DMA is safe) it reads from the twin's RM file, TWIN_RM, that the twin keeps true (hwsim/rm.py).
 * Memory is host memory; copies are real memcpy.
 *
 * Built per driver version by twin/userspace.py with -DTWIN_VERSION="580.159.04"
 * -DTWIN_DRIVER_API=13000; C11 + POSIX only, so it links against an older glibc too.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#define TWIN_RM "/proc/driver/gpuhost-twin-rm"
#define MAX_GPUS 64
#define NVIDIA_MAJOR 195u
#define CTL_MINOR 255
#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705,
    CUDA_ERROR_TOO_MANY_PEERS = 711,
    CUDA_ERROR_SYSTEM_NOT_READY = 802,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
    CUDA_ERROR_UNKNOWN = 999,
};

static const struct { int code; const char *name, *text; } ERRORS[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
     "peer access is not supported between these two devices"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
     "peer access is already enabled"},
    {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
     "peer access has not been enabled"},
    {CUDA_ERROR_TOO_MANY_PEERS, "CUDA_ERROR_TOO_MANY_PEERS",
     "peer mapping resources exhausted"},
    {CUDA_ERROR_SYSTEM_NOT_READY, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
     "system has unsupported display driver / cuda driver combination"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

struct ctx {
    int dev;
    unsigned char peer[MAX_GPUS]; /* cuCtxEnablePeerAccess(this -> peer) done */
};

struct gpu {
    char bdf[32], uuid[64], name[128];
    int minor;
    struct ctx ctx;
};

struct alloc {
    unsigned char *mem;
    size_t size;
    int dev;
    struct alloc *next;
};

/* The RM's view: every GPU bound to nvidia (not just the visible ones), by bdf. */
struct rm {
    char version[64];
    int uvm_major; /* -1: nvidia_uvm not loaded */
    int hmm_disabled;
    int ngpus;
    struct gpu gpus[MAX_GPUS];
    int p2p_ok[MAX_GPUS][MAX_GPUS], corrupts[MAX_GPUS][MAX_GPUS];
    int fabric_pending; /* NVSwitch board whose fabric manager has not configured it yet */
    int nvswitch;       /* the board has NVSwitches (the RM file has a fabric line) */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int init_result = -1; /* -1: cuInit not called yet; a failed cuInit stays failed */
static struct rm rm;
static int ndev;           /* CUDA devices: visible GPUs with a usable node, in PCI order */
static int dev_rm[MAX_GPUS]; /* CUDA ordinal -> index in rm.gpus */
static struct alloc *allocs;
static _Thread_local struct ctx *current;

static int rm_index(const char *bdf) {
    for (int i = 0; i < rm.ngpus; i++)
        if (strcmp(rm.gpus[i].bdf, bdf) == 0) return i;
    return -1;
}

/* Lines: "version V", "uvm_major N", "uvm_disable_hmm Y|N", "gpu BDF MINOR UUID NAME...",
 * "p2p BDF BDF R W CORRUPTS" (R/W: topo -p2p r/w cells; CORRUPTS 0|1), "fabric STATE" (NVSwitch
 * boards: in_progress until nvidia-fabricmanager configured them, then completed). 0 = no
 * driver. */
static int read_rm(void) {
    FILE *f = fopen(TWIN_RM, "r");
    char line[512], a[32], b[32], r[8], w[8];
    int n, c;
    if (!f) return 0;
    memset(&rm, 0, sizeof rm);
    rm.uvm_major = -1;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (sscanf(line, "version %63s", rm.version) == 1) continue;
        if (sscanf(line, "uvm_major %d", &rm.uvm_major) == 1) continue;
        if (strncmp(line, "fabric ", 7) == 0) {
            rm.nvswitch = 1;
            rm.fabric_pending = strcmp(line + 7, "completed") != 0;
            continue;
        }
        if (strncmp(line, "uvm_disable_hmm ", 16) == 0) {
            rm.hmm_disabled = line[16] == 'Y';
        } else if (strncmp(line, "gpu ", 4) == 0 && rm.ngpus < MAX_GPUS) {
            struct gpu *g = &rm.gpus[rm.ngpus];
            if (sscanf(line, "gpu %31s %d %63s %n", g->bdf, &g->minor, g->uuid, &n) == 3) {
                snprintf(g->name, sizeof g->name, "%s", line + n);
                rm.ngpus++;
            }
        } else if (sscanf(line, "p2p %31s %31s %7s %7s %d", a, b, r, w, &c) == 5) {
            int i = rm_index(a), j = rm_index(b);
            if (i >= 0 && j >= 0) {
                rm.p2p_ok[i][j] = strcmp(r, "OK") == 0 && strcmp(w, "OK") == 0;
                rm.corrupts[i][j] = c;
            }
        }
    }
    fclose(f);
    return rm.version[0] != 0;
}

enum node_state { NODE_OK, NODE_MISSING, NODE_WRONG, NODE_DENIED };

/* What opening a device node tells: the kernel's device cgroup answers EPERM before any
 * driver is asked; with no nvidia driver on this machine an allowed node answers ENXIO. */
static enum node_state node(const char *path, unsigned major, int minor) {
    struct stat st;
    int fd;
    if (stat(path, &st) != 0) return NODE_MISSING;
    if (!S_ISCHR(st.st_mode) || major(st.st_rdev) != major ||
        (minor >= 0 && (int)minor(st.st_rdev) != minor))
        return NODE_WRONG;
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return NODE_OK;
    }
    return (errno == ENXIO || errno == ENODEV) ? NODE_OK : NODE_DENIED;
}

/* As systemd-detect-virt decides: pid 1's environment has container= (LXC sets container=lxc),
 * or /run/systemd/container exists (systemd writes it in a container; an init that rewrites
 * its argv area, like sshd, loses the first). */
static int in_container(void) {
    char buf[8192];
    size_t n;
    FILE *f;
    if (access("/run/systemd/container", F_OK) == 0) return 1;
    if (!(f = fopen("/proc/1/environ", "r"))) return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
        if (strncmp(buf + i, "container=", 10) == 0) return 1;
    return 0;
}

/* As the real library does (nvidia-modprobe's README): a missing node is made by the setuid
 * nvidia-modprobe helper before it is opened; on the host, as root, where mknod is allowed. */
static void make_nodes(const char *args) {
    char cmd[128];
    if (geteuid() != 0 || in_container()) return;
    snprintf(cmd, sizeof cmd, "nvidia-modprobe %s >/dev/null 2>&1", args);
    if (system(cmd) != 0) return;
}

/* CUDA_VISIBLE_DEVICES: ordinals or GPU UUIDs (prefixes allowed), cut at the first unknown. */
static void apply_visible(int *usable, int nusable) {
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    char buf[1024], *save = NULL, *tok;
    int order[MAX_GPUS], n = 0;
    if (!env) {
        for (int i = 0; i < nusable; i++) dev_rm[i] = usable[i];
        ndev = nusable;
        return;
    }
    snprintf(buf, sizeof buf, "%s", env);
    for (tok = strtok_r(buf, ",", &save); tok && n < MAX_GPUS; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        long k = strtol(tok, &end, 10);
        int found = -1;
        if (end != tok && *end == 0) {
            if (k >= 0 && k < nusable) found = usable[k];
        } else {
            for (int i = 0; i < nusable; i++)
                if (strncmp(rm.gpus[usable[i]].uuid, tok, strlen(tok)) == 0) found = usable[i];
        }
        if (found < 0) break;
        order[n++] = found;
    }
    for (int i = 0; i < n; i++) dev_rm[i] = order[i];
    ndev = n;
}

static CUresult do_init(void) {
    char path[64];
    int usable[MAX_GPUS], nusable = 0;
    if (!read_rm()) return CUDA_ERROR_NO_DEVICE; /* no nvidia module: nothing to talk to */
    if (access("/dev/nvidiactl", F_OK) != 0) make_nodes("-c 0");
    if (access("/dev/nvidia-uvm", F_OK) != 0) make_nodes("-u -c 0");
    for (int i = 0; i < rm.ngpus; i++) {
        char args[32];
        snprintf(path, sizeof path, "/dev/nvidia%d", rm.gpus[i].minor);
        snprintf(args, sizeof args, "-c %d", rm.gpus[i].minor);
        if (access(path, F_OK) != 0) make_nodes(args);
    }
    if (node("/dev/nvidiactl", NVIDIA_MAJOR, CTL_MINOR) != NODE_OK) return CUDA_ERROR_NO_DEVICE;
    /* The real library's first ioctl on nvidiactl compares versions with the kernel module. */
    if (strcmp(rm.version, TWIN_VERSION) != 0) return CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    /* NVSwitch systems: "not yet ready to start any CUDA work" until the fabric manager has
     * configured the fabric (CUDA driver API, CUDA_ERROR_SYSTEM_NOT_READY = 802). */
    if (rm.fabric_pending) return CUDA_ERROR_SYSTEM_NOT_READY;
    if (rm.uvm_major < 0 || node("/dev/nvidia-uvm", (unsigned)rm.uvm_major, 0) != NODE_OK)
        return CUDA_ERROR_UNKNOWN; /* "CUDA error 999" after a stale uvm major */
    if (!rm.hmm_disabled && in_container())
        return CUDA_ERROR_UNKNOWN; /* operator log: init failed in LXC until uvm_disable_hmm=1 */
    for (int i = 0; i < rm.ngpus; i++) {
        snprintf(path, sizeof path, "/dev/nvidia%d", rm.gpus[i].minor);
        if (node(path, NVIDIA_MAJOR, rm.gpus[i].minor) == NODE_OK) usable[nusable++] = i;
    }
    apply_visible(usable, nusable);
    for (int i = 0; i < rm.ngpus; i++) rm.gpus[i].ctx.dev = -1;
    for (int d = 0; d < ndev; d++) rm.gpus[dev_rm[d]].ctx.dev = d;
    return ndev ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

EXPORT CUresult cuInit(unsigned int flags) {
    CUresult rc;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (init_result < 0) init_result = do_init();
    rc = init_result;
    pthread_mutex_unlock(&lock);
    return rc;
}

static CUresult ready(void) {
    return init_result == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

static struct gpu *gpu_of(CUdevice dev) {
    return (dev >= 0 && dev < ndev) ? &rm.gpus[dev_rm[dev]] : NULL;
}

static int is_ctx(const struct ctx *c) {
    for (int d = 0; d < ndev; d++)
        if (c == &gpu_of(d)->ctx) return 1;
    return 0;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++)
        if (ERRORS[i].code == error) return *out = ERRORS[i].name, CUDA_SUCCESS;
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++)
        if (ERRORS[i].code == error) return *out = ERRORS[i].text, CUDA_SUCCESS;
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* A property of the library, not of the kernel: answers even when cuInit failed. */
EXPORT CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = TWIN_DRIVER_API;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    if (ready()) return ready();
    *count = ndev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    if (ready()) return ready();
    if (!gpu_of(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

/* "[domain]:[bus]:[device].[function]", 13 bytes with the NUL (cuda.h). */
EXPORT CUresult cuDeviceGetPCIBusId(char *out, int len, CUdevice dev) {
    unsigned dom, bus, slot, fn;
    struct gpu *g;
    if (!out || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (ready()) return ready();
    if (!(g = gpu_of(dev))) return CUDA_ERROR_INVALID_DEVICE;
    if (sscanf(g->bdf, "%x:%x:%x.%x", &dom, &bus, &slot, &fn) != 4) return CUDA_ERROR_UNKNOWN;
    snprintf(out, (size_t)len, "%04X:%02X:%02X.%X", dom, bus, slot, fn);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *out, int len, CUdevice dev) {
    struct gpu *g;
    if (!out || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (ready()) return ready();
    if (!(g = gpu_of(dev))) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(out, (size_t)len, "%s", g->name);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(struct ctx **pctx, CUdevice dev) {
    struct gpu *g;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (ready()) return ready();
    if (!(g = gpu_of(dev))) return CUDA_ERROR_INVALID_DEVICE;
    *pctx = &g->ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    if (ready()) return ready();
    return gpu_of(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuCtxSetCurrent(struct ctx *c) {
    if (ready()) return ready();
    if (c && !is_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    current = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(struct ctx **pctx) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (ready()) return ready();
    *pctx = current;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
    if (ready()) return ready();
    return current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* The driver's topo -p2p r and w answers: both OK -> peers may map each other. */
EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
    if (!can) return CUDA_ERROR_INVALID_VALUE;
    if (ready()) return ready();
    if (!gpu_of(dev) || !gpu_of(peer)) return CUDA_ERROR_INVALID_DEVICE;
    *can = dev != peer && rm.p2p_ok[dev_rm[dev]][dev_rm[peer]];
    return CUDA_SUCCESS;
}

/* Peer connections are a per-device hardware resource shared by every process: "on
 * non-NVSwitch enabled systems, each device can support a system-wide maximum of eight peer
 * connections" (CUDA C++ Programming Guide, Peer-to-Peer Memory Access); past it
 * cuCtxEnablePeerAccess returns CUDA_ERROR_TOO_MANY_PEERS, "the hardware resources required to
 * enable peer access have been exhausted for one or more of the devices" (cuda.h). The twin's RM
 * keeps that table system-wide as one file per process under PEERS_DIR ("BDF BDF" per enabled
 * mapping); a file whose process is gone holds nothing, as the real driver frees a dead
 * process's mappings. */
#define PEERS_DIR "/run/gpuhost-twin-peers"
#define MAX_PEERS 8

static void save_peers(void) {
    char path[64], tmp[80];
    FILE *f;
    mkdir(PEERS_DIR, 0755);
    snprintf(path, sizeof path, PEERS_DIR "/%d", (int)getpid());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!(f = fopen(tmp, "w"))) return;
    for (int d = 0; d < ndev; d++)
        for (int p = 0; p < ndev; p++)
            if (gpu_of(d)->ctx.peer[p]) fprintf(f, "%s %s\n", gpu_of(d)->bdf, gpu_of(p)->bdf);
    fclose(f);
    rename(tmp, path);
}

/* Marks in seen[] (by rm index) every GPU that holds a peer connection with `bdf`, in any live
 * process (this one included, through its saved file). */
static void connected(const char *bdf, int *seen) {
    DIR *dir = opendir(PEERS_DIR);
    struct dirent *e;
    char path[300], a[32], b[32];
    if (!dir) return;
    while ((e = readdir(dir))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        FILE *f;
        if (end == e->d_name || *end || (kill((pid_t)pid, 0) != 0 && errno == ESRCH)) continue;
        snprintf(path, sizeof path, PEERS_DIR "/%s", e->d_name);
        if (!(f = fopen(path, "r"))) continue;
        while (fscanf(f, "%31s %31s", a, b) == 2) {
            int i = strcmp(a, bdf) == 0 ? rm_index(b) : strcmp(b, bdf) == 0 ? rm_index(a) : -1;
            if (i >= 0) seen[i] = 1;
        }
        fclose(f);
    }
    closedir(dir);
}

/* Would a new connection between a and b pass one device's limit? */
static int too_many_peers(const struct gpu *a, const struct gpu *b) {
    const struct gpu *ends[2] = {a, b};
    if (rm.nvswitch) return 0;
    for (int k = 0; k < 2; k++) {
        int seen[MAX_GPUS] = {0}, n = 0;
        connected(ends[k]->bdf, seen);
        if (seen[rm_index(ends[1 - k]->bdf)]) continue; /* already connected: no new slot */
        for (int i = 0; i < rm.ngpus; i++) n += seen[i];
        if (n >= MAX_PEERS) return 1;
    }
    return 0;
}

EXPORT CUresult cuCtxEnablePeerAccess(struct ctx *peer, unsigned int flags) {
    if (ready()) return ready();
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!peer || !is_ctx(peer)) return CUDA_ERROR_INVALID_CONTEXT;
    if (peer == current) return CUDA_ERROR_INVALID_DEVICE;
    if (!rm.p2p_ok[dev_rm[current->dev]][dev_rm[peer->dev]])
        return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    if (current->peer[peer->dev]) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    if (too_many_peers(gpu_of(current->dev), gpu_of(peer->dev))) return CUDA_ERROR_TOO_MANY_PEERS;
    current->peer[peer->dev] = 1;
    save_peers();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDisablePeerAccess(struct ctx *peer) {
    if (ready()) return ready();
    if (!current || !peer || !is_ctx(peer)) return CUDA_ERROR_INVALID_CONTEXT;
    if (!current->peer[peer->dev]) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    current->peer[peer->dev] = 0;
    save_peers();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    struct alloc *a;
    if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (ready()) return ready();
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!(a = malloc(sizeof *a)) || !(a->mem = malloc(size))) {
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->size = size;
    a->dev = current->dev;
    pthread_mutex_lock(&lock);
    a->next = allocs;
    allocs = a;
    pthread_mutex_unlock(&lock);
    *dptr = (CUdeviceptr)(uintptr_t)a->mem;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    struct alloc **p, *a;
    if (ready()) return ready();
    pthread_mutex_lock(&lock);
    for (p = &allocs; *p && (*p)->mem != (unsigned char *)(uintptr_t)dptr; p = &(*p)->next) {
    }
    a = *p;
    if (a) *p = a->next;
    pthread_mutex_unlock(&lock);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    free(a->mem);
    free(a);
    return CUDA_SUCCESS;
}

/* The allocation holding [dptr, dptr + n), or NULL. */
static struct alloc *range(CUdeviceptr dptr, size_t n) {
    struct alloc *a;
    uintptr_t p = (uintptr_t)dptr;
    pthread_mutex_lock(&lock);
    for (a = allocs; a; a = a->next) {
        uintptr_t lo = (uintptr_t)a->mem;
        if (p >= lo && p - lo <= a->size && n <= a->size - (p - lo)) break;
    }
    pthread_mutex_unlock(&lock);
    return a;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    if (ready()) return ready();
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!range(dst, n) || (!src && n)) return CUDA_ERROR_INVALID_VALUE;
    memcpy((void *)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    if (ready()) return ready();
    if (!current) return CUDA_ERROR_INVALID_CONTEXT;
    if (!range(src, n) || (!dst && n)) return CUDA_ERROR_INVALID_VALUE;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

/* Between two devices with peer access enabled the copy is a P2P DMA; where the machine's P2P
 * DMA corrupts (SEV-SNP, translated IOMMU domains), one byte per 4 KiB page arrives flipped.
 * Without peer access (never enabled, or refused) the driver stages the copy through host
 * memory: "if peer-to-peer access is enabled between two devices ... peer-to-peer memory copy
 * between these two devices no longer needs to be staged through the host and is therefore
 * faster" (CUDA C++ Programming Guide, Peer-to-Peer Memory Copy). The twin stages it for real,
 * device -> host buffer -> device, and paces it to the simulated host path's bandwidth
 * (HOST_PATH_BPS, a PCIe-class rate below any peer link): P2P copies run at memcpy speed, far
 * above it, so a probe can tell the two apart by speed as it must on a real host. */
#define HOST_PATH_BPS 2e9
static unsigned char *staging;
static size_t staging_size;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static CUresult staged_copy(unsigned char *out, const unsigned char *in, size_t n) {
    double start = now(), left;
    pthread_mutex_lock(&lock);
    if (staging_size < n) {
        unsigned char *grown = realloc(staging, n);
        if (!grown) return pthread_mutex_unlock(&lock), CUDA_ERROR_OUT_OF_MEMORY;
        staging = grown, staging_size = n;
    }
    memcpy(staging, in, n);
    memcpy(out, staging, n);
    pthread_mutex_unlock(&lock);
    left = (double)n / HOST_PATH_BPS - (now() - start);
    if (left > 0) {
        struct timespec t = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        while (nanosleep(&t, &t) != 0 && errno == EINTR) {
        }
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyPeer(CUdeviceptr dst, struct ctx *dctx, CUdeviceptr src,
                             struct ctx *sctx, size_t n) {
    unsigned char *out = (unsigned char *)(uintptr_t)dst;
    if (ready()) return ready();
    if (!dctx || !sctx || !is_ctx(dctx) || !is_ctx(sctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (!range(dst, n) || !range(src, n)) return CUDA_ERROR_INVALID_VALUE;
    if (dctx != sctx && !sctx->peer[dctx->dev] && !dctx->peer[sctx->dev])
        return staged_copy(out, (const unsigned char *)(uintptr_t)src, n);
    memmove(out, (const void *)(uintptr_t)src, n);
    if (dctx != sctx && rm.corrupts[dev_rm[sctx->dev]][dev_rm[dctx->dev]])
        for (size_t i = 256; i < n; i += 4096) out[i] ^= 0xFF;
    return CUDA_SUCCESS;
}
