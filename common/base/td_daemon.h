/* td_daemon.h: what every tandem daemon does around its event loop: systemd readiness and
 * watchdog notifications (sd_notify; harmless no-ops when not run by systemd), and orderly
 * shutdown on SIGTERM / SIGINT delivered through the loop.
 */
#ifndef TD_DAEMON_H
#define TD_DAEMON_H

#include "td_config.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

typedef struct td_daemon td_daemon_t;

/* What a daemon does before it builds anything: `--help` and `--version`, the configuration in
 * layers (td_config_load: defaults, --config INI, environment with `env_prefix`, flags), then the
 * log level and format from the table's "log.level" and "log.format" options (both required). */
typedef struct td_daemon_boot {
    const char *program;    /* "tandem-router": --version line and error prefixes */
    const char *component;  /* log component ("router", "prefill", ...) */
    const char *env_prefix; /* "TANDEM_ROUTER" */
    const td_opt_t *opts;
    size_t n_opts;
    void *cfg;                                /* the program's config struct, zeroed */
    void (*usage)(FILE *out, const void *ud); /* --help text before the option list */
    const void *ud;
} td_daemon_boot_t;

/* Boot: 0 when the daemon should run (cfg filled, logging set up; free cfg with
 * td_config_free). Otherwise the process must exit with *status: 0 after --help or --version,
 * 2 after a configuration error (already printed to stderr, naming the file, variable or flag);
 * cfg is freed then. */
int td_daemon_boot(const td_daemon_boot_t *b, int argc, char **argv, int *status);

/* Called on the loop thread when SIGTERM or SIGINT arrives (signum says which). A second signal
 * while shutting down is passed again; the daemon decides whether to hurry. */
typedef void (*td_daemon_stop_cb)(td_daemon_t *d, int signum, void *ud);

/* Install signal handling and, when systemd asked for one (WATCHDOG_USEC), a watchdog timer that
 * pings at half the interval. Returns NULL on allocation failure. Handles are unref'd: they do
 * not keep the loop alive. */
td_daemon_t *td_daemon_start(uv_loop_t *loop, td_daemon_stop_cb on_stop, void *ud);

/* Tell systemd the daemon is ready (READY=1) with a status line; call only once the model is
 * loaded and memory registered. 0 when sent or when not under systemd; TD_EIO on failure. */
int td_daemon_ready(td_daemon_t *d, const char *status);
/* Update the STATUS= line shown by `systemctl status`. */
int td_daemon_status(td_daemon_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* STOPPING=1: the daemon has begun an orderly shutdown. */
int td_daemon_stopping(td_daemon_t *d);
/* Whether a stop signal has arrived. */
bool td_daemon_is_stopping(const td_daemon_t *d);
/* The watchdog interval systemd asked for, in microseconds (0 when none). */
uint64_t td_daemon_watchdog_usec(const td_daemon_t *d);

/* Close the handles; `d` is freed once they are closed (run the loop to finish). */
void td_daemon_close(td_daemon_t *d);

#endif
