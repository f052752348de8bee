/* error.c: the error table, errno translation and per-thread detail messages. */
#include "td_error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local char detail[1024];

const char *td_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
#define TD_ERR_MSG(name, val, msg)                                                                 \
    case TD_##name:                                                                                \
        return msg;
        TD_ERRNO_MAP(TD_ERR_MSG)
#undef TD_ERR_MSG
    default:
        return "unknown error";
    }
}

const char *td_err_name(int err)
{
    switch (err) {
    case 0:
        return "TD_OK";
#define TD_ERR_NAME(name, val, msg)                                                                \
    case TD_##name:                                                                                \
        return "TD_" #name;
        TD_ERRNO_MAP(TD_ERR_NAME)
#undef TD_ERR_NAME
    default:
        return "TD_EUNKNOWN";
    }
}

int td_err_from_errno(int errnum)
{
    if (errnum < 0)
        errnum = -errnum;
    switch (errnum) {
    case 0:
        return 0;
    case ENOMEM:
        return TD_ENOMEM;
    case ENOENT:
    case ENOTDIR:
        return TD_ENOENT;
    case EINVAL:
        return TD_EINVAL;
    case ERANGE:
        return TD_ERANGE;
    case EEXIST:
        return TD_EEXIST;
    case EAGAIN:
        return TD_EAGAIN;
    case EBUSY:
        return TD_EBUSY;
    case ETIMEDOUT:
        return TD_ETIMEDOUT;
    case ECANCELED:
        return TD_ECANCELED;
    case ECONNREFUSED:
        return TD_ECONNREFUSED;
    case ECONNRESET:
    case EPIPE:
        return TD_ECONNRESET;
    case EHOSTUNREACH:
    case ENETUNREACH:
        return TD_EUNREACH;
    case ENOSPC:
        return TD_ENOSPC;
    case EOVERFLOW:
    case EFBIG:
        return TD_EOVERFLOW;
    case ENOTSUP:
        return TD_ENOTSUP;
    default:
        return TD_EIO;
    }
}

int td_err_vset(int err, const char *fmt, va_list ap)
{
    vsnprintf(detail, sizeof(detail), fmt, ap);
    return err;
}

int td_err_set(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    td_err_vset(err, fmt, ap);
    va_end(ap);
    return err;
}

const char *td_err_msg(void)
{
    return detail;
}

void td_err_clear(void)
{
    detail[0] = '\0';
}

void td__assert_fail(const char *expr, const char *file, int line, const char *func)
{
    fprintf(stderr, "tandem: assertion failed: %s (%s:%d, %s)\n", expr, file, line, func);
    fflush(stderr);
    abort();
}
