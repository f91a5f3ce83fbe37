/*
 * noautomount.so: statx() and fstatat() retried without AT_NO_AUTOMOUNT when the kernel
 * rejects that flag with EINVAL. Loaded into every dynamically linked process of the sandbox
 * through /etc/ld.so.preload.
 *
 * Why: gVisor before 2023-02 (commit 7a0c4b57, "Ignore AT_NO_AUTOMOUNT flag in statx() calls";
 * fstatat followed in 2023-10, 2df63d77) answers EINVAL to AT_NO_AUTOMOUNT, and Debian
 * bookworm's runsc (0.0~20221219) is such a gVisor. coreutils 9.1 calls
 * statx(..., AT_NO_AUTOMOUNT | AT_SYMLINK_NOFOLLOW, ...), so `ls -l` and `stat` fail with
 * "Invalid argument" in a gVisor sandbox.
 *
 * Why this is sound: AT_NO_AUTOMOUNT only says "do not trigger an automount on the last path
 * component". gVisor has no automounts, so the call without the flag means the same thing.
 * Linux accepts the flag, so under runc the first call never fails for it and nothing is
 * retried. A call that is invalid for another reason fails the same way without the flag, so
 * the retry cannot turn an invalid call into a valid one. Once the flag has been refused, the
 * process drops it at once (one system call per stat, not two).
 *
 * What it does not cover: statically linked programs and programs that issue the system call
 * themselves (none in the image passes AT_NO_AUTOMOUNT: Python, git, Node.js/libuv and Rust's
 * standard library do not).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

typedef int (*statx_fn)(int, const char *, int, unsigned int, struct statx *);
typedef int (*fstatat_fn)(int, const char *, struct stat *, int);
typedef int (*fstatat64_fn)(int, const char *, struct stat64 *, int);

static statx_fn real_statx;
static fstatat_fn real_fstatat;
static fstatat64_fn real_fstatat64;
/* Set once the kernel has refused AT_NO_AUTOMOUNT: it will refuse it again. */
static volatile int automount_flag_refused;

__attribute__((constructor)) static void noautomount_init(void) {
    real_statx = (statx_fn)dlsym(RTLD_NEXT, "statx");
    real_fstatat = (fstatat_fn)dlsym(RTLD_NEXT, "fstatat");
    real_fstatat64 = (fstatat64_fn)dlsym(RTLD_NEXT, "fstatat64");
}

/* The call, and once more without AT_NO_AUTOMOUNT if the kernel refused the flag. */
#define WITHOUT_REFUSED_AUTOMOUNT_FLAG(call_with_flags)                                     \
    do {                                                                                    \
        if (automount_flag_refused)                                                         \
            flags &= ~AT_NO_AUTOMOUNT;                                                      \
        int result = call_with_flags(flags);                                                \
        if (result == -1 && errno == EINVAL && (flags & AT_NO_AUTOMOUNT)) {                 \
            result = call_with_flags(flags & ~AT_NO_AUTOMOUNT);                             \
            /* Past flag validation without it: this kernel refuses the flag itself. */     \
            if (result == 0 || errno != EINVAL)                                             \
                automount_flag_refused = 1;                                                 \
        }                                                                                   \
        return result;                                                                      \
    } while (0)

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
#define CALL(f) real_statx(dirfd, path, (f), mask, buf)
    WITHOUT_REFUSED_AUTOMOUNT_FLAG(CALL);
#undef CALL
}

int fstatat(int dirfd, const char *path, struct stat *buf, int flags) {
#define CALL(f) real_fstatat(dirfd, path, buf, (f))
    WITHOUT_REFUSED_AUTOMOUNT_FLAG(CALL);
#undef CALL
}

int fstatat64(int dirfd, const char *path, struct stat64 *buf, int flags) {
#define CALL(f) real_fstatat64(dirfd, path, buf, (f))
    WITHOUT_REFUSED_AUTOMOUNT_FLAG(CALL);
#undef CALL
}
