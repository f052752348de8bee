/* td_jinja.h: a Jinja2 template engine for Hugging Face chat templates.
 *
 * The subset real `chat_template`s use, with the semantics of Python Jinja2 3.1 as transformers'
 * apply_chat_template configures it: ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
 * loopcontrols, keep_trailing_newline off, its own `tojson` (json.dumps with ensure_ascii=False),
 * `raise_exception` and `strftime_now` globals, and the `{% generation %}` block (rendered as its
 * body). Output is byte for byte what Python renders (tests/chat/, docs/chat-templates.md).
 *
 * Supported: text, `{{ }}`, `{% %}`, `{# #}`, `-`/`+` whitespace control, raw; if/elif/else,
 * for (tuple targets, `if` filter, else, loop.*), set (names, tuples, namespace attributes,
 * blocks), macro (defaults, keyword arguments), filter blocks, break/continue; literals, lists,
 * dicts, tuples, attribute/item access, slicing, calls, the arithmetic, comparison, logic, `in`,
 * `~` and conditional expressions; the filters, tests, globals and str/dict/list methods
 * templates use (jinja_filters.c lists them). `include`, `extends`, `import`, `call` blocks and
 * `recursive` loops are refused at parse time.
 *
 * A parsed template is immutable: threads may render it at once. Rendering is bounded (output
 * size, loop iterations, call depth, memory) so a runaway template fails instead of hanging.
 */
#ifndef TD_JINJA_H
#define TD_JINJA_H

#include "td_util.h"

#include <stddef.h>
#include <stdint.h>

struct json_object;

typedef struct td_jinja td_jinja_t;

/* Limits of one render. Zero fields take the defaults below. */
typedef struct td_jinja_limits {
    size_t max_output;     /* bytes of output (default 16 MiB) */
    size_t max_memory;     /* bytes of scratch values (default 256 MiB) */
    uint64_t max_steps;    /* loop iterations plus calls (default 10,000,000) */
    unsigned max_depth;    /* nested macro calls (default 100) */
} td_jinja_limits_t;

#define TD_JINJA_DEFAULT_MAX_OUTPUT ((size_t)16 << 20)
#define TD_JINJA_DEFAULT_MAX_MEMORY ((size_t)256 << 20)
#define TD_JINJA_DEFAULT_MAX_STEPS 10000000ull
#define TD_JINJA_DEFAULT_MAX_DEPTH 100u

/* Options of one render. */
typedef struct td_jinja_opts {
    td_jinja_limits_t limits;
    int64_t now_s; /* strftime_now's clock, seconds since the epoch, local time; 0 = the wall
                    * clock (tests pin it) */
} td_jinja_opts_t;

/* Parse `len` bytes of template source (UTF-8). `what` names the source in error messages
 * (e.g. "model/tokenizer_config.json: chat_template"). Errors: TD_EPARSE with td_err_msg
 * "WHAT:LINE:COL: message", TD_ENOTSUP (a construct outside the subset, with its position),
 * TD_EINVAL (invalid UTF-8, with its position), TD_ENOMEM. */
int td_jinja_parse(const char *src, size_t len, const char *what, td_jinja_t **out);

/* Release a parsed template. NULL is a no-op. */
void td_jinja_free(td_jinja_t *t);

/* Render with the variables of `vars` (a JSON object; keys become template variables, JSON
 * values become None/bool/int/float/str/list/dict) and append the output to `out`. On error
 * out->len is restored and td_err_msg says why: TD_EINVAL with "raise_exception: MESSAGE" when
 * the template raised (td_jinja_raised then gives MESSAGE), TD_EINVAL with "WHAT:LINE: message"
 * for a runtime error Jinja2 would raise (undefined attribute of undefined, type errors),
 * TD_ERANGE when a limit is hit, TD_ENOMEM. */
int td_jinja_render(const td_jinja_t *t, const struct json_object *vars,
                    const td_jinja_opts_t *opts, td_buf_t *out);

/* True when the last td_jinja_render on this thread failed because the template called
 * raise_exception; its message is then td_err_msg() after "raise_exception: ". */
bool td_jinja_raised(void);

#endif
