/* A slow disk for tests: fsync and fdatasync wait PAYONCE_TEST_SYNC_DELAY
 * seconds before syncing, and append the calling thread's id to
 * PAYONCE_TEST_SYNC_LOG. Loaded with LD_PRELOAD into a gateway, it shows
 * whether a disk sync can stall the event loop (tests/gateway/conftest.py,
 * slow_sync). Built by the tests with the machine's gcc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void slow_down(void) {
    const char *log = getenv("PAYONCE_TEST_SYNC_LOG");
    if (log != NULL) {
        int fd = open(log, O_WRONLY | O_APPEND | O_CREAT, 0600);
        if (fd >= 0) {
            char line[32];
            int n = snprintf(line, sizeof line, "%ld:%ld\n", (long)getpid(), (long)syscall(SYS_gettid));
            if (write(fd, line, (size_t)n) < 0) { /* nothing to be done */ }
            close(fd);
        }
    }
    const char *delay = getenv("PAYONCE_TEST_SYNC_DELAY");
    double seconds = delay != NULL ? atof(delay) : 0.0;
    if (seconds > 0) {
        struct timespec wait = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
        while (nanosleep(&wait, &wait) != 0) { }
    }
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    slow_down();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    slow_down();
    return real(fd);
}
