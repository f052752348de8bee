/* td_config.h: declarative configuration from an INI file, then the environment, then flags.
 *
 * A program describes its options once, as a table of td_opt_t that maps "section.key" to a field
 * of its own config struct. td_config_load fills the struct from the defaults, then the INI file
 * (`--config PATH` on the command line, or the `ini_path` argument), then environment variables
 * (PREFIX_SECTION_KEY, upper case, '.' and '-' as '_'), then flags (`--section.key=value`,
 * `--section.key value`, or `--section-key=value`); later sources win. Unknown keys in the file
 * and unknown flags are errors that name the key and where it came from. Environment variables
 * that match no option are ignored, since several programs share one environment.
 */
#ifndef TD_CONFIG_H
#define TD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum td_opt_type {
    TD_OPT_STR,    /* char * (heap, owned by the struct; free with td_config_free) */
    TD_OPT_INT,    /* int64_t */
    TD_OPT_UINT,   /* uint64_t */
    TD_OPT_DOUBLE, /* double */
    TD_OPT_BOOL,   /* bool; a bare flag `--x` means true */
    TD_OPT_SIZE,   /* uint64_t bytes, with K/M/G/T suffixes */
} td_opt_type_t;

typedef struct td_opt {
    const char *name;   /* "section.key", or "key" for the unnamed top section */
    td_opt_type_t type;
    size_t offset;      /* offsetof(config struct, field) */
    const char *def;    /* default as text; NULL leaves the field zero / NULL */
    const char *help;   /* one line for --help and docs/configuration.md */
    double min, max;    /* numeric bounds, checked when min < max */
} td_opt_t;

/* Where a value came from, for error messages. */
typedef enum td_config_source {
    TD_CFG_DEFAULT,
    TD_CFG_FILE,
    TD_CFG_ENV,
    TD_CFG_FLAG,
} td_config_source_t;

/* Fill `cfg` from defaults, file, environment and argv. `env_prefix` like "TANDEM" (NULL: no
 * environment). `ini_path` may be NULL; `--config PATH` in argv overrides it. argv[0] is skipped;
 * arguments that do not start with "--" are positional: their indices are stored in `positional`
 * (capacity `max_positional`) and their count in `*n_positional` (both may be NULL when none are
 * allowed, and then one is an error). `--help` and `--version` are not handled here.
 * Returns 0 or a TD_E* code with td_err_msg naming the file, line and key or flag. */
int td_config_load(const td_opt_t *opts, size_t n_opts, void *cfg, const char *ini_path,
                   const char *env_prefix, int argc, char **argv, int *positional,
                   size_t max_positional, size_t *n_positional);

/* Set one option by name from text, as if from `source`. TD_EUNKNOWNKEY when no option matches. */
int td_config_set(const td_opt_t *opts, size_t n_opts, void *cfg, const char *name,
                  const char *value, td_config_source_t source);

/* Free the strings the struct owns. */
void td_config_free(const td_opt_t *opts, size_t n_opts, void *cfg);

/* Print every option with its default and help, grouped by section. */
void td_config_print_help(FILE *out, const td_opt_t *opts, size_t n_opts, const char *env_prefix);

/* Print the effective configuration as INI. */
void td_config_print_ini(FILE *out, const td_opt_t *opts, size_t n_opts, const void *cfg);

#endif
