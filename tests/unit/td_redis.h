/* td_redis.h: a private redis-server for a test: a free loopback port, no persistence, killed
 * when the test process dies; and the libuv loop helpers of tests that talk to it. Header-only
 * (static functions): include it from one test file. */
#ifndef TD_TEST_REDIS_H
#define TD_TEST_REDIS_H

#include <arpa/inet.h>
#include <check.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "td_util.h"

static int redis_port;
static pid_t redis_pid;

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    socklen_t len = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &len);
    close(fd);
    return ntohs(sa.sin_port);
}

static long long redis_int(const char *fmt, const char *arg)
{
    redisContext *c = redisConnect("127.0.0.1", redis_port);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return -1;
    }
    redisReply *r = redisCommand(c, fmt, arg);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r && r->type == REDIS_REPLY_STATUS)
        v = 0;
    freeReplyObject(r);
    redisFree(c);
    return v;
}

static void redis_start(void)
{
    char port[16];
    snprintf(port, sizeof(port), "%d", redis_port);
    redis_pid = fork();
    if (redis_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a test that failed mid-way */
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--loglevel", "warning", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        if (redis_int("PING", NULL) == 0)
            return;
        usleep(10000);
    }
    ck_abort_msg("redis-server did not start on port %d", redis_port);
}

static void redis_stop(void)
{
    kill(redis_pid, SIGKILL);
    waitpid(redis_pid, NULL, 0);
}

/* A test's start: redis-server on a free port, `loop` initialised, `addr` its "host:port". */
static void redis_setup(uv_loop_t *loop, char addr[32])
{
    redis_port = free_port();
    redis_start();
    ck_assert_int_eq(uv_loop_init(loop), 0);
    snprintf(addr, 32, "127.0.0.1:%d", redis_port);
}

/* Run `loop` until cond(arg) holds or `ms` pass; whether it holds. */
static bool loop_run_until(uv_loop_t *loop, bool (*cond)(void *), void *arg, int ms)
{
    uint64_t end = td_now_ns() + (uint64_t)ms * 1000000;
    while (!cond(arg) && td_now_ns() < end) {
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(500);
    }
    return cond(arg);
}

/* Let what was closed finish closing, then close the loop (every handle must be gone). */
static void loop_finish(uv_loop_t *loop)
{
    for (int i = 0; i < 500 && uv_run(loop, UV_RUN_NOWAIT); i++)
        usleep(1000);
    uv_run(loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(loop), 0);
}

#endif
