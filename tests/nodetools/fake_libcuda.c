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
    default: return 1;
    }
}

CUresult cuGetErrorString(CUresult error, const char **str) {
    switch (error) {
    case CUDA_ERROR_OUT_OF_MEMORY: *str = "out of memory"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_INITIALIZED: *str = "initialization error"; return CUDA_SUCCESS;
    case CUDA_ERROR_ILLEGAL_STATE: *str = "the operation cannot be performed in the present state"; return CUDA_SUCCESS;
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
#endif
