/* An LD_PRELOAD shim that makes libc's fsync and fdatasync fail with EIO,
 * as a dying disk does, for the files whose path ends with
 * $RAFTSCHED_FAULT_FSYNC_SUFFIX, once the file $RAFTSCHED_FAULT_FSYNC_TRIGGER
 * exists (so that a node starts normally and fails when the test says).
 * With $RAFTSCHED_FAULT_WRITE_TOO set, pwrite of those files fails with EIO
 * as well. With $RAFTSCHED_FAULT_FSYNC_HITS set, each failed call appends
 * its name to that file (the chaos nemesis tells "the node never synced"
 * from "the sync failed and the node carried on"). Everything else goes to
 * the real functions. Built by tests/bad_disks.py and chaos/cluster.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int should_fail(int fd) {
    const char *trigger = getenv("RAFTSCHED_FAULT_FSYNC_TRIGGER");
    const char *suffix = getenv("RAFTSCHED_FAULT_FSYNC_SUFFIX");
    char link[64];
    char target[4096];
    ssize_t length;
    size_t suffix_length;
    if (trigger == NULL || suffix == NULL || access(trigger, F_OK) != 0) {
        return 0;
    }
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    length = readlink(link, target, sizeof target - 1);
    if (length < 0) {
        return 0;
    }
    target[length] = '\0';
    suffix_length = strlen(suffix);
    return (size_t)length >= suffix_length
        && strcmp(target + length - suffix_length, suffix) == 0;
}

static void record_hit(const char *name) {
    const char *hits = getenv("RAFTSCHED_FAULT_FSYNC_HITS");
    int saved = errno;
    int out;
    if (hits == NULL) {
        return;
    }
    out = open(hits, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (out >= 0) {
        (void)!write(out, name, strlen(name));
        (void)!write(out, "\n", 1);
        close(out);
    }
    errno = saved;
}

int fsync(int fd) {
    static int (*real)(int) = NULL;
    if (real == NULL) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    }
    if (should_fail(fd)) {
        record_hit("fsync");
        errno = EIO;
        return -1;
    }
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int) = NULL;
    if (real == NULL) {
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    }
    if (should_fail(fd)) {
        record_hit("fdatasync");
        errno = EIO;
        return -1;
    }
    return real(fd);
}

static ssize_t failed_write(int fd) {
    if (getenv("RAFTSCHED_FAULT_WRITE_TOO") != NULL && should_fail(fd)) {
        record_hit("pwrite");
        errno = EIO;
        return 1;
    }
    return 0;
}

ssize_t pwrite(int fd, const void *buffer, size_t count, off_t offset) {
    static ssize_t (*real)(int, const void *, size_t, off_t) = NULL;
    if (real == NULL) {
        real = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
    }
    if (failed_write(fd)) {
        return -1;
    }
    return real(fd, buffer, count, offset);
}

ssize_t pwrite64(int fd, const void *buffer, size_t count, off_t offset) {
    static ssize_t (*real)(int, const void *, size_t, off_t) = NULL;
    if (real == NULL) {
        real = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite64");
    }
    if (failed_write(fd)) {
        return -1;
    }
    return real(fd, buffer, count, offset);
}
