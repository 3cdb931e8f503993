/*
 * FAKE libcuda for the tests of nodetools/cuda_checkpoint_api.py on machines without a GPU: NOT the
 * NVIDIA driver. It exports the CUDA checkpoint driver API (cuInit, cuCheckpointProcess*,
 * cuGetErrorName/String, cuDriverGetVersion) with the signatures and argument structures of the
 * CUDA Driver API documentation, keeps each pid's CUprocessState in a file (every call of the tool
 * is a new process), and appends one line per call to a log:
 *
 *   FAKE_LIBCUDA_LOG    the call log:  NAME PID [argsize=N timeoutMs=N reserved_zero=0|1]
 *   FAKE_LIBCUDA_STATE  a folder: one file per pid holding its state digit (no file: not a CUDA process)
 *   FAKE_LIBCUDA_FAIL   NAME:PID  makes that call on that pid return CUDA_ERROR_OUT_OF_MEMORY
 *
 * Built with -DFAKE_OLD_DRIVER it exports only cuInit and cuDriverGetVersion (a driver before 570).
 *
 * For nodetools/h2d_copy.py it also exports the device, context, memory and copy calls of the driver
 * API: FAKE GPUs whose "device memory" is host memory (malloc), so a copy is a memcpy, and the log gets
 * one line per allocation and copy (which host buffer, pinned or pageable, and how many bytes):
 *
 *   FAKE_LIBCUDA_GPUS       how many FAKE GPUs (default 1)
 *   FAKE_LIBCUDA_MEM_MIB    each one's memory in MiB (default 1024)
 *   FAKE_LIBCUDA_NO_DEVICE  set: cuInit returns CUDA_ERROR_NO_DEVICE, as the driver does without a GPU
 *   FAKE_LIBCUDA_CORRUPT    set: every host-to-device copy changes one byte (a broken copy path)
 *   FAKE_LIBCUDA_FAIL       also NAME:ORDINAL for cuMemAlloc_v2 and cuMemHostAlloc (the current GPU)
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef uint64_t cuuint64_t;

enum { CUDA_SUCCESS = 0, CUDA_ERROR_OUT_OF_MEMORY = 2, CUDA_ERROR_NOT_INITIALIZED = 3,
       CUDA_ERROR_ILLEGAL_STATE = 401 };
enum { CUDA_ERROR_NO_DEVICE = 100, CUDA_ERROR_INVALID_DEVICE = 101, CUDA_ERROR_INVALID_CONTEXT = 201 };
enum { RUNNING = 0, LOCKED = 1, CHECKPOINTED = 2, FAILED = 3 };

typedef struct { unsigned int timeoutMs; unsigned int reserved0; cuuint64_t reserved1[7]; } CUcheckpointLockArgs;
typedef struct { cuuint64_t reserved[8]; } CUcheckpointCheckpointArgs;
typedef struct { cuuint64_t reserved[8]; } CUcheckpointRestoreArgs;
typedef struct { cuuint64_t reserved[8]; } CUcheckpointUnlockArgs;

static int initialised;

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...) {
    const char *path = getenv("FAKE_LIBCUDA_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

CUresult cuInit(unsigned int flags) {
    logf_("cuInit flags=%u", flags);
    if (getenv("FAKE_LIBCUDA_NO_DEVICE")) return CUDA_ERROR_NO_DEVICE;
    initialised = 1;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
#ifdef FAKE_OLD_DRIVER
    *version = 12040;
#else
    *version = 13000;
#endif
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **str) {
    switch (error) {
    case CUDA_ERROR_OUT_OF_MEMORY: *str = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_INITIALIZED: *str = "CUDA_ERROR_NOT_INITIALIZED"; return CUDA_SUCCESS;
    case CUDA_ERROR_ILLEGAL_STATE: *str = "CUDA_ERROR_ILLEGAL_STATE"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *str = "CUDA_ERROR_NO_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE: *str = "CUDA_ERROR_INVALID_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *str = "CUDA_ERROR_INVALID_CONTEXT"; return CUDA_SUCCESS;
    default: return 1;
    }
}

CUresult cuGetErrorString(CUresult error, const char **str) {
    switch (error) {
    case CUDA_ERROR_OUT_OF_MEMORY: *str = "out of memory"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_INITIALIZED: *str = "initialization error"; return CUDA_SUCCESS;
    case CUDA_ERROR_ILLEGAL_STATE: *str = "the operation cannot be performed in the present state"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *str = "no CUDA-capable device is detected"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE: *str = "invalid device ordinal"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *str = "invalid device context"; return CUDA_SUCCESS;
    default: return 1;
    }
}

#ifndef FAKE_OLD_DRIVER
static void state_path(int pid, char *buf, size_t len) {
    const char *dir = getenv("FAKE_LIBCUDA_STATE");
    snprintf(buf, len, "%s/%d", dir ? dir : ".", pid);
}

static int get_state(int pid) {
    char path[4096];
    state_path(pid, path, sizeof path);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int state = -1;
    if (fscanf(f, "%d", &state) != 1) state = -1;
    fclose(f);
    return state;
}

static void set_state(int pid, int state) {
    char path[4096];
    state_path(pid, path, sizeof path);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "%d\n", state);
    fclose(f);
}

static int reserved_zero(const void *args, size_t from, size_t size) {
    const unsigned char *bytes = args;
    for (size_t i = from; i < size; i++)
        if (bytes[i]) return 0;
    return 1;
}

static int injected(const char *name, int pid) {
    const char *fail = getenv("FAKE_LIBCUDA_FAIL");
    char want[256];
    snprintf(want, sizeof want, "%s:%d", name, pid);
    return fail && strcmp(fail, want) == 0;
}

/* One transition: from -> to, or an error, after the common checks. */
static CUresult transition(const char *name, int pid, int from, int to) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    int state = get_state(pid);
    if (state < 0) return CUDA_ERROR_NOT_INITIALIZED;
    if (injected(name, pid)) return CUDA_ERROR_OUT_OF_MEMORY;
    if (state != from) return CUDA_ERROR_ILLEGAL_STATE;
    set_state(pid, to);
    return CUDA_SUCCESS;
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
    logf_("cuCheckpointProcessLock %d argsize=%zu timeoutMs=%u reserved_zero=%d", pid, sizeof *args,
          args ? args->timeoutMs : 0, args ? reserved_zero(args, sizeof(unsigned int), sizeof *args) : 1);
    return transition("cuCheckpointProcessLock", pid, RUNNING, LOCKED);
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args) {
    logf_("cuCheckpointProcessCheckpoint %d argsize=%zu reserved_zero=%d", pid, sizeof *args,
          args ? reserved_zero(args, 0, sizeof *args) : 1);
    return transition("cuCheckpointProcessCheckpoint", pid, LOCKED, CHECKPOINTED);
}

CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args) {
    logf_("cuCheckpointProcessRestore %d argsize=%zu reserved_zero=%d", pid, sizeof *args,
          args ? reserved_zero(args, 0, sizeof *args) : 1);
    return transition("cuCheckpointProcessRestore", pid, CHECKPOINTED, LOCKED);
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args) {
    logf_("cuCheckpointProcessUnlock %d argsize=%zu reserved_zero=%d", pid, sizeof *args,
          args ? reserved_zero(args, 0, sizeof *args) : 1);
    return transition("cuCheckpointProcessUnlock", pid, LOCKED, RUNNING);
}

CUresult cuCheckpointProcessGetState(int pid, int *state) {
    logf_("cuCheckpointProcessGetState %d", pid);
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    int s = get_state(pid);
    if (s < 0) return CUDA_ERROR_NOT_INITIALIZED;
    *state = s;
    return CUDA_SUCCESS;
}

CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) {
    logf_("cuCheckpointProcessGetRestoreThreadId %d", pid);
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (get_state(pid) < 0) return CUDA_ERROR_NOT_INITIALIZED;
    *tid = pid + 1;
    return CUDA_SUCCESS;
}

/* --- FAKE GPUs for nodetools/h2d_copy.py: "device memory" is host memory, a copy is a memcpy --- */
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static int current_device = -1; /* the GPU whose primary context is current; -1: none */
static struct { void *ptr; size_t size; } pinned[16];

static int fake_gpus(void) {
    const char *n = getenv("FAKE_LIBCUDA_GPUS");
    return n ? atoi(n) : 1;
}

static size_t fake_mem_bytes(void) {
    const char *n = getenv("FAKE_LIBCUDA_MEM_MIB");
    return (size_t)(n ? atol(n) : 1024) << 20;
}

static const char *host_kind(const void *p) {
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++)
        if (pinned[i].ptr && (const char *)p >= (const char *)pinned[i].ptr
            && (const char *)p < (const char *)pinned[i].ptr + pinned[i].size)
            return "pinned";
    return "pageable";
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    *count = fake_gpus();
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= fake_gpus()) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice device) {
    snprintf(name, (size_t)len, "FAKE GPU %d (tests/nodetools/fake_libcuda.c)", device);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice device) {
    snprintf(bus, (size_t)len, "0000:%02X:00.0", 0xF0 + device);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    (void)device;
    *bytes = fake_mem_bytes();
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
    logf_("cuDevicePrimaryCtxRetain device=%d", device);
    *context = (CUcontext)(size_t)(device + 1);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    logf_("cuDevicePrimaryCtxRelease_v2 device=%d", device);
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext context) {
    current_device = context ? (int)(size_t)context - 1 : -1;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    return current_device < 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes) {
    logf_("cuMemAlloc_v2 bytes=%zu", bytes);
    if (current_device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (injected("cuMemAlloc_v2", current_device) || bytes > fake_mem_bytes()) return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = malloc(bytes);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)(size_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) {
    logf_("cuMemFree_v2");
    free((void *)(size_t)ptr);
    return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **ptr, size_t bytes, unsigned int flags) {
    logf_("cuMemHostAlloc bytes=%zu flags=%u", bytes, flags);
    if (current_device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (injected("cuMemHostAlloc", current_device)) return CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++) {
        if (pinned[i].ptr) continue;
        if (!(*ptr = malloc(bytes))) return CUDA_ERROR_OUT_OF_MEMORY;
        pinned[i].ptr = *ptr;
        pinned[i].size = bytes;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFreeHost(void *ptr) {
    logf_("cuMemFreeHost");
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++)
        if (pinned[i].ptr == ptr) pinned[i].ptr = NULL;
    free(ptr);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
    logf_("cuMemcpyHtoD_v2 host=%s bytes=%zu", host_kind(src), bytes);
    if (current_device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    memcpy((void *)(size_t)dst, src, bytes);
    if (getenv("FAKE_LIBCUDA_CORRUPT") && bytes) ((unsigned char *)(size_t)dst)[bytes / 2] ^= 0xFF;
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
    logf_("cuMemcpyDtoH_v2 host=%s bytes=%zu", host_kind(dst), bytes);
    if (current_device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    memcpy(dst, (const void *)(size_t)src, bytes);
    return CUDA_SUCCESS;
}
#endif
