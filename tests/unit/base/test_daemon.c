/* test_daemon.c: sd_notify readiness, status and watchdog pings against a real notify socket, and
 * SIGTERM/SIGINT delivered through the loop. */
#include "td_daemon.h"
#include "td_util.h"
#include "td_check.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int notify_socket(char *path, size_t n)
{
    snprintf(path, n, "/tmp/td_notify_%d.sock", (int)getpid());
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    setenv("NOTIFY_SOCKET", path, 1);
    return fd;
}

static int recv_msg(int fd, char *buf, size_t n)
{
    ssize_t r = recv(fd, buf, n - 1, 0);
    buf[r > 0 ? r : 0] = '\0';
    return (int)r;
}

static int stops, last_sig;

static void wake(uv_timer_t *t)
{
}

static void on_stop(td_daemon_t *d, int signum, void *ud)
{
    stops++;
    last_sig = signum;
}

START_TEST(test_notify_and_watchdog)
{
    char path[108], buf[512];
    int fd = notify_socket(path, sizeof(path));
    char pid[32];
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    setenv("WATCHDOG_USEC", "100000", 1);
    uv_loop_t loop;
    uv_loop_init(&loop);
    td_daemon_t *d = td_daemon_start(&loop, on_stop, NULL);
    ck_assert_ptr_nonnull(d);
    ck_assert_uint_eq(td_daemon_watchdog_usec(d), 100000);
    ck_assert_int_eq(td_daemon_ready(d, "model loaded"), 0);
    ck_assert_int_gt(recv_msg(fd, buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "READY=1\nSTATUS=model loaded");
    ck_assert_int_eq(td_daemon_status(d, "%d workers", 3), 0);
    recv_msg(fd, buf, sizeof(buf));
    ck_assert_str_eq(buf, "STATUS=3 workers");
    /* the watchdog pings at half the interval while the loop runs */
    uv_timer_t keep;
    uv_timer_init(&loop, &keep);
    int pings = 0;
    uint64_t end = td_now_ns() + 400 * 1000000ull;
    while (td_now_ns() < end) {
        uv_timer_start(&keep, wake, 20, 0);
        uv_run(&loop, UV_RUN_ONCE);
        while (recv_msg(fd, buf, sizeof(buf)) > 0)
            pings += strcmp(buf, "WATCHDOG=1") == 0;
    }
    ck_assert_int_ge(pings, 3);
    /* SIGTERM arrives through the loop */
    ck_assert(!td_daemon_is_stopping(d));
    raise(SIGTERM);
    for (int i = 0; i < 100 && !stops; i++) {
        uv_timer_start(&keep, wake, 10, 0);
        uv_run(&loop, UV_RUN_ONCE);
    }
    ck_assert_int_eq(stops, 1);
    ck_assert_int_eq(last_sig, SIGTERM);
    ck_assert(td_daemon_is_stopping(d));
    ck_assert_int_eq(td_daemon_stopping(d), 0);
    recv_msg(fd, buf, sizeof(buf));
    ck_assert_str_eq(buf, "STOPPING=1");
    td_daemon_close(d);
    uv_close((uv_handle_t *)&keep, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    close(fd);
    unlink(path);
}
END_TEST

START_TEST(test_no_systemd)
{
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    uv_loop_t loop;
    uv_loop_init(&loop);
    td_daemon_t *d = td_daemon_start(&loop, on_stop, NULL);
    ck_assert_uint_eq(td_daemon_watchdog_usec(d), 0);
    ck_assert_int_eq(td_daemon_ready(d, "x"), 0); /* a no-op, not an error */
    td_daemon_close(d);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("daemon");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_notify_and_watchdog);
    tcase_add_test(tc, test_no_systemd);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}
