/* td_log.h: structured logging.
 *
 * One line per event, as logfmt (`ts=... level=info comp=router req=r-12 msg="..."`) or as JSON
 * lines. Under systemd (JOURNAL_STREAM set and matching stderr) each line starts with the
 * journald priority prefix `<N>` and the timestamp is left to the journal. Thread-safe: a line is
 * formatted into a local buffer and written with one write(2).
 */
#ifndef TD_LOG_H
#define TD_LOG_H

#include <stdbool.h>

typedef enum td_log_level {
    TD_LOG_ERROR = 0,
    TD_LOG_WARN = 1,
    TD_LOG_INFO = 2,
    TD_LOG_DEBUG = 3,
    TD_LOG_TRACE = 4,
} td_log_level_t;

typedef enum td_log_format {
    TD_LOG_LOGFMT = 0,
    TD_LOG_JSON = 1,
} td_log_format_t;

/* Configure the process-wide logger. `fd` is where lines go (2 for stderr). `component` names the
 * process in every line ("router", "prefill", ...). Journald prefixes are detected from the
 * environment unless `journald` is forced off by td_log_set_journald(false). */
void td_log_init(const char *component, td_log_level_t level, td_log_format_t format, int fd);
void td_log_set_level(td_log_level_t level);
void td_log_set_journald(bool on);
bool td_log_enabled(td_log_level_t level);

/* Parse "error|warn|info|debug|trace" and "logfmt|json". 0 or TD_EINVAL. */
int td_log_level_parse(const char *s, td_log_level_t *out);
int td_log_format_parse(const char *s, td_log_format_t *out);
const char *td_log_level_name(td_log_level_t level);

/* Log one event. `req_id` may be NULL. `kv` is an optional NULL-terminated list of extra
 * key/value string pairs added as fields; use td_logf for the common case. */
void td_log_kv(td_log_level_t level, const char *req_id, const char *const *kv, const char *fmt,
               ...) __attribute__((format(printf, 4, 5)));
#define td_logf(level, req_id, ...)                                                                \
    do {                                                                                           \
        if (td_log_enabled(level))                                                                 \
            td_log_kv((level), (req_id), NULL, __VA_ARGS__);                                       \
    } while (0)

#define TD_LOG_E(...) td_logf(TD_LOG_ERROR, NULL, __VA_ARGS__)
#define TD_LOG_W(...) td_logf(TD_LOG_WARN, NULL, __VA_ARGS__)
#define TD_LOG_I(...) td_logf(TD_LOG_INFO, NULL, __VA_ARGS__)
#define TD_LOG_D(...) td_logf(TD_LOG_DEBUG, NULL, __VA_ARGS__)

#endif
