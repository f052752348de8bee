/* td_daemon.h: what every tandem daemon does around its event loop: systemd readiness and
 * watchdog notifications (sd_notify; harmless no-ops when not run by systemd), and orderly
 * shutdown on SIGTERM / SIGINT delivered through the loop.
 */
#ifndef TD_DAEMON_H
#define TD_DAEMON_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

typedef struct td_daemon td_daemon_t;

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
