/* config.c: INI (inih), environment and flag layering over a declarative option table. */
#include "td_config.h"
#include "td_error.h"
#include "td_util.h"

#include <ctype.h>
#include <ini.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

static const char *source_name(td_config_source_t s)
{
    switch (s) {
    case TD_CFG_FILE: return "config file";
    case TD_CFG_ENV: return "environment";
    case TD_CFG_FLAG: return "command line";
    default: return "default";
    }
}

/* Compare option names treating '-' and '_' alike ('.' separates the section). */
static bool name_eq(const char *a, const char *b, size_t blen)
{
    size_t i = 0;
    for (; i < blen && a[i]; i++) {
        char x = a[i] == '-' ? '_' : a[i];
        char y = b[i] == '-' ? '_' : b[i];
        if (x != y)
            return false;
    }
    return i == blen && a[i] == '\0';
}

static const td_opt_t *find_opt(const td_opt_t *opts, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (name_eq(opts[i].name, name, len))
            return &opts[i];
    return NULL;
}

static int set_value(const td_opt_t *o, void *cfg, const char *value, td_config_source_t src)
{
    char *field = (char *)cfg + o->offset;
    int rc = 0;
    double num = 0;
    switch (o->type) {
    case TD_OPT_STR: {
        char *dup = td_strdup(value);
        if (!dup)
            return TD_ENOMEM;
        free(*(char **)field);
        *(char **)field = dup;
        return 0;
    }
    case TD_OPT_INT: {
        int64_t v;
        rc = td_parse_i64(value, &v);
        if (!rc) {
            *(int64_t *)field = v;
            num = (double)v;
        }
        break;
    }
    case TD_OPT_UINT: {
        uint64_t v;
        rc = td_parse_u64(value, &v);
        if (!rc) {
            *(uint64_t *)field = v;
            num = (double)v;
        }
        break;
    }
    case TD_OPT_SIZE: {
        uint64_t v;
        rc = td_parse_size(value, &v);
        if (!rc) {
            *(uint64_t *)field = v;
            num = (double)v;
        }
        break;
    }
    case TD_OPT_DOUBLE: {
        double v;
        rc = td_parse_double(value, &v);
        if (!rc) {
            *(double *)field = v;
            num = v;
        }
        break;
    }
    case TD_OPT_BOOL: {
        bool v;
        rc = td_parse_bool(value, &v);
        if (!rc)
            *(bool *)field = v;
        return rc ? td_err_set(TD_EINVAL, "%s: option \"%s\": \"%s\" is not a boolean",
                               source_name(src), o->name, value)
                  : 0;
    }
    }
    if (rc)
        return td_err_set(rc, "%s: option \"%s\": \"%s\" is not a valid %s", source_name(src),
                          o->name, value,
                          o->type == TD_OPT_DOUBLE ? "number"
                          : o->type == TD_OPT_SIZE ? "size"
                                                   : "integer");
    if (o->min < o->max && (num < o->min || num > o->max))
        return td_err_set(TD_ERANGE, "%s: option \"%s\": %s is outside [%g, %g]",
                          source_name(src), o->name, value, o->min, o->max);
    return 0;
}

int td_config_set(const td_opt_t *opts, size_t n_opts, void *cfg, const char *name,
                  const char *value, td_config_source_t source)
{
    const td_opt_t *o = find_opt(opts, n_opts, name, strlen(name));
    if (!o)
        return td_err_set(TD_EUNKNOWNKEY, "%s: unknown option \"%s\"", source_name(source), name);
    return set_value(o, cfg, value, source);
}

struct ini_ctx {
    const td_opt_t *opts;
    size_t n;
    void *cfg;
    const char *path;
    FILE *f;
    int lineno; /* line the reader returned last: inih's handler is called right after it */
    int rc;     /* first error from the handler, and the line it was on */
    int rc_line;
};

/* fgets for inih that counts lines, since Debian's inih is built without INI_HANDLER_LINENO. */
static char *ini_reader_fn(char *str, int num, void *stream)
{
    struct ini_ctx *c = stream;
    char *r = fgets(str, num, c->f);
    if (r)
        c->lineno++;
    return r;
}

static int on_ini_entry(void *user, const char *section, const char *key, const char *value)
{
    struct ini_ctx *c = user;
    int lineno = c->lineno;
    if (c->rc)
        return 0;
    c->rc_line = lineno;
    char name[256];
    if (section && *section)
        snprintf(name, sizeof(name), "%s.%s", section, key);
    else
        snprintf(name, sizeof(name), "%s", key);
    const td_opt_t *o = find_opt(c->opts, c->n, name, strlen(name));
    if (!o) {
        c->rc = td_err_set(TD_EUNKNOWNKEY, "%s:%d: unknown key \"%s\"%s%s%s", c->path, lineno,
                           key, section && *section ? " in section [" : "",
                           section && *section ? section : "", section && *section ? "]" : "");
        return 0;
    }
    int rc = set_value(o, c->cfg, value, TD_CFG_FILE);
    if (rc) {
        char inner[512];
        snprintf(inner, sizeof(inner), "%s", td_err_msg());
        c->rc = td_err_set(rc, "%s:%d: %s", c->path, lineno, inner);
        return 0;
    }
    return 1;
}

static int load_file(const td_opt_t *opts, size_t n, void *cfg, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return td_err_set(TD_ENOENT, "%s: cannot open config file", path);
    struct ini_ctx c = {opts, n, cfg, path, f, 0, 0, 0};
    int r = ini_parse_stream(ini_reader_fn, &c, on_ini_entry, &c);
    fclose(f);
    if (r > 0 && (!c.rc || r < c.rc_line))
        return td_err_set(TD_EPARSE, "%s:%d: malformed line", path, r);
    if (c.rc)
        return c.rc;
    if (r > 0)
        return td_err_set(TD_EPARSE, "%s:%d: malformed line", path, r);
    if (r < 0)
        return td_err_set(TD_EIO, "%s: cannot read config file", path);
    return 0;
}

static int load_env(const td_opt_t *opts, size_t n, void *cfg, const char *prefix)
{
    size_t plen = strlen(prefix);
    for (size_t i = 0; i < n; i++) {
        char var[256];
        size_t k = 0;
        memcpy(var, prefix, plen);
        k = plen;
        var[k++] = '_';
        for (const char *p = opts[i].name; *p && k + 1 < sizeof(var); p++)
            var[k++] = (*p == '.' || *p == '-') ? '_' : (char)toupper((unsigned char)*p);
        var[k] = '\0';
        const char *v = getenv(var);
        if (!v)
            continue;
        int rc = set_value(&opts[i], cfg, v, TD_CFG_ENV);
        if (rc) {
            char inner[512];
            snprintf(inner, sizeof(inner), "%s", td_err_msg());
            return td_err_set(rc, "%s (from %s)", inner, var);
        }
    }
    return 0;
}

int td_config_load(const td_opt_t *opts, size_t n_opts, void *cfg, const char *ini_path,
                   const char *env_prefix, int argc, char **argv, int *positional,
                   size_t max_positional, size_t *n_positional)
{
    int rc;
    if (n_positional)
        *n_positional = 0;
    for (size_t i = 0; i < n_opts; i++) {
        if (opts[i].def && (rc = set_value(&opts[i], cfg, opts[i].def, TD_CFG_DEFAULT)))
            return rc;
    }
    /* --config first: the file is the lowest layer after defaults. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            break;
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc)
                return td_err_set(TD_EINVAL, "command line: --config needs a file path");
            ini_path = argv[++i];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            ini_path = argv[i] + 9;
        }
    }
    if (ini_path && *ini_path && (rc = load_file(opts, n_opts, cfg, ini_path)))
        return rc;
    if (env_prefix && (rc = load_env(opts, n_opts, cfg, env_prefix)))
        return rc;
    bool only_positional = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_positional || strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (!only_positional && strcmp(a, "--") == 0) {
                only_positional = true;
                continue;
            }
            if (!n_positional || *n_positional >= max_positional)
                return td_err_set(TD_EINVAL, "command line: unexpected argument \"%s\"", a);
            positional[(*n_positional)++] = i;
            continue;
        }
        a += 2;
        if (strcmp(a, "config") == 0) {
            i++;
            continue;
        }
        if (strncmp(a, "config=", 7) == 0)
            continue;
        const char *eq = strchr(a, '=');
        size_t klen = eq ? (size_t)(eq - a) : strlen(a);
        const td_opt_t *o = find_opt(opts, n_opts, a, klen);
        if (!o) {
            /* accept --section-key for section.key */
            char alt[256];
            if (klen < sizeof(alt)) {
                memcpy(alt, a, klen);
                alt[klen] = '\0';
                for (size_t j = 0; j < n_opts && !o; j++) {
                    char dotted[256];
                    snprintf(dotted, sizeof(dotted), "%s", opts[j].name);
                    for (char *p = dotted; *p; p++)
                        if (*p == '.')
                            *p = '-';
                    if (name_eq(dotted, alt, klen))
                        o = &opts[j];
                }
            }
        }
        if (!o)
            return td_err_set(TD_EUNKNOWNKEY, "command line: unknown option \"--%.*s\"",
                              (int)klen, a);
        const char *val;
        if (eq)
            val = eq + 1;
        else if (o->type == TD_OPT_BOOL &&
                 (i + 1 >= argc || td_parse_bool(argv[i + 1], &(bool){0}) != 0))
            val = "true";
        else if (i + 1 < argc)
            val = argv[++i];
        else
            return td_err_set(TD_EINVAL, "command line: option \"--%s\" needs a value", o->name);
        if ((rc = set_value(o, cfg, val, TD_CFG_FLAG)))
            return rc;
    }
    return 0;
}

void td_config_free(const td_opt_t *opts, size_t n_opts, void *cfg)
{
    for (size_t i = 0; i < n_opts; i++) {
        if (opts[i].type == TD_OPT_STR) {
            char **f = (char **)((char *)cfg + opts[i].offset);
            free(*f);
            *f = NULL;
        }
    }
}

static const char *type_name(td_opt_type_t t)
{
    switch (t) {
    case TD_OPT_STR: return "string";
    case TD_OPT_INT: return "int";
    case TD_OPT_UINT: return "uint";
    case TD_OPT_DOUBLE: return "number";
    case TD_OPT_BOOL: return "bool";
    case TD_OPT_SIZE: return "size";
    }
    return "?";
}

void td_config_print_help(FILE *out, const td_opt_t *opts, size_t n_opts, const char *env_prefix)
{
    fprintf(out, "Options (INI key section.key, flag --section.key=VALUE");
    if (env_prefix)
        fprintf(out, ", environment %s_SECTION_KEY", env_prefix);
    fprintf(out, "; later wins):\n  --config PATH  INI configuration file\n");
    for (size_t i = 0; i < n_opts; i++) {
        fprintf(out, "  --%s=%s\n      %s", opts[i].name, type_name(opts[i].type),
                opts[i].help ? opts[i].help : "");
        if (opts[i].def)
            fprintf(out, " (default: %s)", *opts[i].def ? opts[i].def : "\"\"");
        fputc('\n', out);
    }
}

void td_config_print_ini(FILE *out, const td_opt_t *opts, size_t n_opts, const void *cfg)
{
    const char *cur = NULL;
    size_t curlen = 0;
    for (size_t i = 0; i < n_opts; i++) {
        const char *name = opts[i].name, *dot = strchr(name, '.');
        size_t slen = dot ? (size_t)(dot - name) : 0;
        const char *key = dot ? dot + 1 : name;
        if (!cur || slen != curlen || strncmp(cur, name, slen) != 0) {
            if (slen)
                fprintf(out, "%s[%.*s]\n", cur ? "\n" : "", (int)slen, name);
            cur = name;
            curlen = slen;
        }
        const char *field = (const char *)cfg + opts[i].offset;
        switch (opts[i].type) {
        case TD_OPT_STR: {
            const char *s = *(char *const *)field;
            fprintf(out, "%s = %s\n", key, s ? s : "");
            break;
        }
        case TD_OPT_INT: fprintf(out, "%s = %lld\n", key, (long long)*(const int64_t *)field); break;
        case TD_OPT_UINT:
        case TD_OPT_SIZE:
            fprintf(out, "%s = %llu\n", key, (unsigned long long)*(const uint64_t *)field);
            break;
        case TD_OPT_DOUBLE: fprintf(out, "%s = %g\n", key, *(const double *)field); break;
        case TD_OPT_BOOL: fprintf(out, "%s = %s\n", key, *(const bool *)field ? "true" : "false"); break;
        }
    }
}
