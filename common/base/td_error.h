/* td_error.h: tandem's error codes, one table, and a per-thread detail message.
 *
 * Functions that act return 0 or a negative TD_E* code. A code says what kind of failure it was;
 * the detail message (td_err_msg) says where: the file, the field, the peer. Foreign error types
 * (errno, UCX, hiredis, CUDA) are translated at the boundary into these codes.
 */
#ifndef TD_ERROR_H
#define TD_ERROR_H

#include <stdarg.h>

/* X(name, value, message) */
#define TD_ERRNO_MAP(X)                                                                            \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(EIO, -3, "input/output error")                                                               \
    X(ENOENT, -4, "no such file or entry")                                                         \
    X(EPARSE, -5, "malformed input")                                                               \
    X(ERANGE, -6, "value out of range")                                                            \
    X(ENOTSUP, -7, "not supported")                                                                \
    X(EEXIST, -8, "already exists")                                                                \
    X(EAGAIN, -9, "resource temporarily unavailable")                                              \
    X(EBUSY, -10, "resource busy")                                                                 \
    X(ETIMEDOUT, -11, "timed out")                                                                 \
    X(ECANCELED, -12, "operation canceled")                                                        \
    X(ECONNREFUSED, -13, "connection refused")                                                     \
    X(ECONNRESET, -14, "connection reset by peer")                                                 \
    X(EUNREACH, -15, "peer unreachable")                                                           \
    X(EPROTO, -16, "protocol error")                                                               \
    X(EAUTH, -17, "authentication failed")                                                         \
    X(EMISMATCH, -18, "layout or model mismatch")                                                  \
    X(ECHECKSUM, -19, "checksum mismatch")                                                         \
    X(EOVERFLOW, -20, "value too large")                                                           \
    X(ECLOSED, -21, "handle closed")                                                               \
    X(ENOSPC, -22, "no space left")                                                                \
    X(EUNKNOWNKEY, -23, "unknown configuration key")                                               \
    X(EINTERNAL, -24, "internal error")                                                            \
    X(EDISABLED, -25, "turned off after an earlier failure")

enum {
#define TD_ERR_ENUM(name, val, msg) TD_##name = (val),
    TD_ERRNO_MAP(TD_ERR_ENUM)
#undef TD_ERR_ENUM
    TD_ERR_LAST_ = -26
};

/* Human-readable message for a TD_E* code ("unknown error" for anything else). Never NULL. */
const char *td_strerror(int err);

/* Symbolic name ("TD_EINVAL"). Never NULL. */
const char *td_err_name(int err);

/* Translate a positive or negative errno value into a TD_E* code. */
int td_err_from_errno(int errnum);

/* Record a detail message for the current thread and return `err` unchanged, so that
 * `return td_err_set(TD_EPARSE, "%s: field \"model.merges\": ...", path);` reads naturally. */
int td_err_set(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int td_err_vset(int err, const char *fmt, va_list ap);

/* The current thread's last detail message, or td_strerror(code) of the last code when none was
 * given; "" before any error. Valid until the next td_err_set on this thread. */
const char *td_err_msg(void);

/* Forget the current thread's detail message. */
void td_err_clear(void);

/* Abort with file and line when an invariant is broken. Never for input, peer or OOM conditions. */
#define TD_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (__builtin_expect(!(cond), 0))                                                          \
            td__assert_fail(#cond, __FILE__, __LINE__, __func__);                                  \
    } while (0)

_Noreturn void td__assert_fail(const char *expr, const char *file, int line, const char *func);

#endif
