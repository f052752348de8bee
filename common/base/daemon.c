/* daemon.c: sd_notify readiness/watchdog and loop-driven signal handling. */
#include "td_daemon.h"
#include "td_error.h"
#include "td_log.h"

#include "td_config_build.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>

struct td_daemon {
    uv_loop_t *loop;
    uv_signal_t sigterm;
    uv_signal_t sigint;
    uv_timer_t watchdog;
    int open_handles;
    uint64_t watchdog_usec; /* interval systemd asked for, 0 when none */
    bool stopping;
    td_daemon_stop_cb on_stop;
    void *ud;
};

static void on_signal(uv_signal_t *h, int signum)
{
    td_daemon_t *d = h->data;
    d->stopping = true;
    td_logf(TD_LOG_INFO, NULL, "received %s, shutting down", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    if (d->on_stop)
        d->on_stop(d, signum, d->ud);
}

static void on_watchdog(uv_timer_t *t)
{
    sd_notify(0, "WATCHDOG=1");
}

td_daemon_t *td_daemon_start(uv_loop_t *loop, td_daemon_stop_cb on_stop, void *ud)
{
    td_daemon_t *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->loop = loop;
    d->on_stop = on_stop;
    d->ud = ud;
    signal(SIGPIPE, SIG_IGN); /* peers that vanish surface as write errors, not deaths */
    uv_signal_init(loop, &d->sigterm);
    uv_signal_init(loop, &d->sigint);
    uv_timer_init(loop, &d->watchdog);
    d->sigterm.data = d->sigint.data = d->watchdog.data = d;
    uv_signal_start(&d->sigterm, on_signal, SIGTERM);
    uv_signal_start(&d->sigint, on_signal, SIGINT);
    uv_unref((uv_handle_t *)&d->sigterm);
    uv_unref((uv_handle_t *)&d->sigint);
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        d->watchdog_usec = usec;
        uint64_t ms = usec / 2000 ? usec / 2000 : 1;
        uv_timer_start(&d->watchdog, on_watchdog, ms, ms);
        uv_unref((uv_handle_t *)&d->watchdog);
    }
    return d;
}

static int notify(const char *state)
{
    int rc = sd_notify(0, state);
    if (rc < 0)
        return td_err_set(TD_EIO, "sd_notify(\"%s\") failed: %s", state, strerror(-rc));
    return 0;
}

int td_daemon_ready(td_daemon_t *d, const char *status)
{
    char msg[512];
    snprintf(msg, sizeof(msg), "READY=1\nSTATUS=%s", status ? status : "ready");
    return notify(msg);
}

int td_daemon_status(td_daemon_t *d, const char *fmt, ...)
{
    char msg[512];
    int n = snprintf(msg, sizeof(msg), "STATUS=");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
    va_end(ap);
    return notify(msg);
}

int td_daemon_stopping(td_daemon_t *d)
{
    d->stopping = true;
    return notify("STOPPING=1");
}

bool td_daemon_is_stopping(const td_daemon_t *d)
{
    return d->stopping;
}

uint64_t td_daemon_watchdog_usec(const td_daemon_t *d)
{
    return d->watchdog_usec;
}

static void on_closed(uv_handle_t *h)
{
    td_daemon_t *d = h->data;
    if (--d->open_handles == 0)
        free(d);
}

void td_daemon_close(td_daemon_t *d)
{
    if (!d)
        return;
    d->open_handles = 3;
    uv_close((uv_handle_t *)&d->sigterm, on_closed);
    uv_close((uv_handle_t *)&d->sigint, on_closed);
    uv_close((uv_handle_t *)&d->watchdog, on_closed);
}

/* The string option `name` of the table, or NULL. */
static const char *opt_str(const td_daemon_boot_t *b, const char *name)
{
    for (size_t i = 0; i < b->n_opts; i++)
        if (b->opts[i].type == TD_OPT_STR && strcmp(b->opts[i].name, name) == 0)
            return *(char *const *)((const char *)b->cfg + b->opts[i].offset);
    return NULL;
}

int td_daemon_boot(const td_daemon_boot_t *b, int argc, char **argv, int *status)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            if (b->usage)
                b->usage(stdout, b->ud);
            td_config_print_help(stdout, b->opts, b->n_opts, b->env_prefix);
            *status = 0;
            return 1;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("%s %s\n", b->program, TD_VERSION);
            *status = 0;
            return 1;
        }
    }
    td_log_init(b->component, TD_LOG_INFO, TD_LOG_LOGFMT, 2);
    int rc = td_config_load(b->opts, b->n_opts, b->cfg, NULL, b->env_prefix, argc, argv, NULL, 0,
                            NULL);
    td_log_level_t level = TD_LOG_INFO;
    td_log_format_t fmt = TD_LOG_LOGFMT;
    if (!rc && td_log_level_parse(opt_str(b, "log.level"), &level))
        rc = td_err_set(TD_EINVAL, "log.level: %s", td_err_msg());
    if (!rc && td_log_format_parse(opt_str(b, "log.format"), &fmt))
        rc = td_err_set(TD_EINVAL, "log.format: %s", td_err_msg());
    if (rc) {
        fprintf(stderr, "%s: %s\n(--help lists the options)\n", b->program, td_err_msg());
        td_config_free(b->opts, b->n_opts, b->cfg);
        *status = 2;
        return 1;
    }
    td_log_init(b->component, level, fmt, 2);
    *status = 0;
    return 0;
}
