/* td_redis.h: a private redis-server for a test: a free loopback port, no persistence, killed
 * when the test process dies. Header-only (static functions): include it from one test file. */
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

#endif
