/* log.c: logfmt / JSON-lines logger with journald priority prefixes. */
#include "td_log.h"
#include "td_error.h"
#include "td_util.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static struct {
    char component[32];
    _Atomic int level;
    td_log_format_t format;
    int fd;
    bool journald;
} logger = {"tandem", TD_LOG_INFO, TD_LOG_LOGFMT, 2, false};

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};
/* syslog priorities: err, warning, info, debug, debug */
static const int journald_prio[] = {3, 4, 6, 7, 7};

/* systemd sets JOURNAL_STREAM=dev:ino for the stream that stderr/stdout is connected to. */
static bool fd_is_journal(int fd)
{
    const char *js = getenv("JOURNAL_STREAM");
    if (!js)
        return false;
    unsigned long long dev, ino;
    if (sscanf(js, "%llu:%llu", &dev, &ino) != 2)
        return false;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return false;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void td_log_init(const char *component, td_log_level_t level, td_log_format_t format, int fd)
{
    snprintf(logger.component, sizeof(logger.component), "%s", component ? component : "tandem");
    atomic_store(&logger.level, (int)level);
    logger.format = format;
    logger.fd = fd;
    logger.journald = fd_is_journal(fd);
}

void td_log_set_level(td_log_level_t level)
{
    atomic_store(&logger.level, (int)level);
}

void td_log_set_journald(bool on)
{
    logger.journald = on;
}

bool td_log_enabled(td_log_level_t level)
{
    return (int)level <= atomic_load_explicit(&logger.level, memory_order_relaxed);
}

const char *td_log_level_name(td_log_level_t level)
{
    return (unsigned)level < TD_ARRAY_LEN(level_names) ? level_names[level] : "info";
}

int td_log_level_parse(const char *s, td_log_level_t *out)
{
    for (size_t i = 0; i < TD_ARRAY_LEN(level_names); i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (td_log_level_t)i;
            return 0;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        *out = TD_LOG_WARN;
        return 0;
    }
    return TD_EINVAL;
}

int td_log_format_parse(const char *s, td_log_format_t *out)
{
    if (strcasecmp(s, "logfmt") == 0 || strcasecmp(s, "text") == 0)
        *out = TD_LOG_LOGFMT;
    else if (strcasecmp(s, "json") == 0)
        *out = TD_LOG_JSON;
    else
        return TD_EINVAL;
    return 0;
}

/* Append a value: logfmt quotes it when it holds spaces, quotes, '=' or control bytes; JSON
 * always quotes and escapes. */
static void put_value(td_buf_t *b, const char *v, bool json)
{
    bool quote = json || *v == '\0';
    for (const char *p = v; !quote && *p; p++)
        quote = (unsigned char)*p <= ' ' || *p == '"' || *p == '=' || *p == '\\';
    if (!quote) {
        td_buf_append_str(b, v);
        return;
    }
    td_buf_append_char(b, '"');
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        switch (*p) {
        case '"': td_buf_append_str(b, "\\\""); break;
        case '\\': td_buf_append_str(b, "\\\\"); break;
        case '\n': td_buf_append_str(b, "\\n"); break;
        case '\r': td_buf_append_str(b, "\\r"); break;
        case '\t': td_buf_append_str(b, "\\t"); break;
        default:
            if (*p < 0x20)
                td_buf_printf(b, "\\u%04x", *p);
            else
                td_buf_append_char(b, (char)*p);
        }
    }
    td_buf_append_char(b, '"');
}

static void put_field(td_buf_t *b, const char *k, const char *v, bool json, bool first)
{
    if (json) {
        if (!first)
            td_buf_append_char(b, ',');
        put_value(b, k, true);
        td_buf_append_char(b, ':');
    } else {
        if (!first)
            td_buf_append_char(b, ' ');
        td_buf_append_str(b, k);
        td_buf_append_char(b, '=');
    }
    put_value(b, v, json);
}

void td_log_kv(td_log_level_t level, const char *req_id, const char *const *kv, const char *fmt,
               ...)
{
    if (!td_log_enabled(level))
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    bool json = logger.format == TD_LOG_JSON;
    td_buf_t b;
    td_buf_init(&b);
    if (logger.journald)
        td_buf_printf(&b, "<%d>", journald_prio[level]);
    if (json)
        td_buf_append_char(&b, '{');
    bool first = true;
    if (!logger.journald) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        char when[64];
        snprintf(when, sizeof(when), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 ts.tv_nsec / 1000000);
        put_field(&b, "ts", when, json, first);
        first = false;
    }
    put_field(&b, "level", td_log_level_name(level), json, first);
    put_field(&b, "comp", logger.component, json, false);
    if (req_id && *req_id)
        put_field(&b, "req", req_id, json, false);
    put_field(&b, "msg", msg, json, false);
    for (size_t i = 0; kv && kv[i] && kv[i + 1]; i += 2)
        put_field(&b, kv[i], kv[i + 1], json, false);
    if (json)
        td_buf_append_char(&b, '}');
    td_buf_append_char(&b, '\n');
    if (b.data) {
        size_t off = 0;
        while (off < b.len) {
            ssize_t w = write(logger.fd, b.data + off, b.len - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
    }
    td_buf_free(&b);
}
