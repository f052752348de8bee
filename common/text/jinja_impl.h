/* jinja_impl.h: what the Jinja engine's files share (td_jinja.h is the public side).
 *
 * jinja.c         the entry points: parse, render, free
 * jinja_lex.c     source -> tokens (whitespace control, trim/lstrip blocks, raw)
 * jinja_parse.c   tokens -> a tree of node_t
 * jinja_value.c   the arena, values (jv_t), Python's str()/repr(), json.dumps, comparisons
 * jinja_eval.c    statements and expressions, scopes, loops, macros, limits
 * jinja_filters.c filters and globals
 * jinja_tests.c   tests (`is defined`, ...), and the str/dict/list methods
 *
 * Memory: everything a parse builds lives in the template's arena, everything a render builds
 * lives in the render's arena; both are freed whole. Errors inside the parser and the evaluator
 * unwind with longjmp to the entry point, which is safe because nothing between holds anything
 * but arena memory.
 */
#ifndef TD_JINJA_IMPL_H
#define TD_JINJA_IMPL_H

#include "td_jinja.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- arena ----------------------------------------------------------------------------------- */

typedef struct jchunk jchunk_t;
typedef struct jarena {
    jchunk_t *head; /* newest chunk first */
    size_t used;    /* bytes handed out, all chunks */
    size_t limit;   /* refuse beyond this (0: no limit) */
    jmp_buf *jb;    /* where an allocation failure unwinds to */
    int *err;       /* set to TD_ENOMEM or TD_ERANGE before unwinding */
} jarena_t;

void *td__jarena_alloc(jarena_t *a, size_t n); /* zeroed, 16-aligned; unwinds on failure */
void td__jarena_free(jarena_t *a);

/* ---- values ---------------------------------------------------------------------------------- */

typedef enum jv_type {
    JV_UNDEF = 0, /* Jinja's Undefined: prints "", iterates empty, false */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,  /* list or tuple (jlist_t.tuple) */
    JV_DICT,
    JV_NS,    /* namespace(): a dict whose attributes may be set */
    JV_FUNC,  /* a global function or a bound method */
    JV_MACRO,
    JV_LOOP,  /* the `loop` variable */
} jv_type_t;

typedef struct jstr {
    size_t n;  /* bytes, UTF-8 */
    char p[];  /* n bytes and a NUL */
} jstr_t;

typedef struct jv jv_t;
typedef struct jlist jlist_t;
typedef struct jdict jdict_t;
typedef struct jfunc jfunc_t;
typedef struct jmacro jmacro_t;
typedef struct jloop jloop_t;

struct jv {
    jv_type_t t;
    union {
        bool b;
        int64_t i;
        double f;
        const jstr_t *s; /* JV_STR; JV_UNDEF: the missing name, or NULL */
        jlist_t *l;
        jdict_t *d;      /* JV_DICT, JV_NS */
        jfunc_t *fn;
        jmacro_t *m;
        jloop_t *loop;
    } u;
};

struct jlist {
    size_t n, cap;
    jv_t *v;    /* [n] */
    bool tuple; /* prints as (a, b) */
    bool gen;   /* a generator in Python (select, map, items, reverse...): always true, no len() */
    bool range; /* a range(): prints as range(a, b[, step]), not JSON; range_args holds them */
    int64_t range_args[3];
};

struct jdict {
    size_t n, cap;
    jv_t *k, *v; /* [n] keys and values, in insertion order */
};

typedef struct jr jr_t;
typedef struct node node_t;

/* A callable: `call` gets positional args[0..n) and keyword kw (may be NULL). */
typedef jv_t (*jfunc_call_t)(jr_t *r, const node_t *at, jfunc_t *self, const jv_t *args, size_t n,
                             jdict_t *kw);
struct jfunc {
    const char *name;
    jfunc_call_t call;
    jv_t bound; /* the object of a bound method */
};

struct jloop {
    size_t index0, length;
    const jlist_t *items;
    unsigned depth0;
};

#define JV_UNDEF_V ((jv_t){.t = JV_UNDEF})
#define JV_NONE_V ((jv_t){.t = JV_NONE})

jv_t td__jv_bool(bool b);
jv_t td__jv_int(int64_t i);
jv_t td__jv_float(double f);
jv_t td__jv_str(jarena_t *a, const char *p, size_t n);
jv_t td__jv_cstr(jarena_t *a, const char *s);
jv_t td__jv_list(jarena_t *a, size_t cap);
jv_t td__jv_dict(jarena_t *a);
void td__jlist_push(jarena_t *a, jlist_t *l, jv_t v);
void td__jdict_set(jarena_t *a, jdict_t *d, jv_t k, jv_t v);
bool td__jdict_get(const jdict_t *d, jv_t k, jv_t *out);
bool td__jdict_get_str(const jdict_t *d, const char *k, size_t n, jv_t *out);

bool td__jv_truthy(jv_t v);
bool td__jv_equal(jv_t a, jv_t b);
/* <0, 0, >0; false when the two cannot be ordered (Python raises TypeError) */
bool td__jv_compare(jv_t a, jv_t b, int *out);
const char *td__jv_type_name(jv_t v); /* Python's type name: "str", "dict", "NoneType", ... */
bool td__jv_len(jv_t v, int64_t *n);  /* Python's len(); false when the value has none */

/* A growing output buffer in an arena. */
typedef struct jbuf {
    char *p;
    size_t n, cap;
} jbuf_t;
void td__jbuf_put(jarena_t *a, jbuf_t *b, const char *p, size_t n);
void td__jbuf_putc(jarena_t *a, jbuf_t *b, char c);
jv_t td__jbuf_str(jarena_t *a, const jbuf_t *b);

/* str(v) / repr(v) appended to b (Python's formatting; Undefined prints ""). */
void td__jv_str_to(jarena_t *a, jbuf_t *b, jv_t v);
void td__jv_repr_to(jarena_t *a, jbuf_t *b, jv_t v);
/* str(v) as a string value (v itself when it already is one). */
jv_t td__jv_to_str(jarena_t *a, jv_t v);
/* json.dumps(v, ensure_ascii, indent (<0: None), separators (NULL: default), sort_keys).
 * Returns false (nothing useful appended) when v holds something JSON cannot represent, with
 * the offending type's name in *bad. */
bool td__jv_json_to(jarena_t *a, jbuf_t *b, jv_t v, bool ensure_ascii, int indent,
                    const char *item_sep, const char *key_sep, bool sort_keys, const char **bad);
/* JSON (json-c) -> value. */
jv_t td__jv_from_json(jarena_t *a, const struct json_object *o);

/* Python's float repr (shortest round-trip), into out (at least 32 bytes). */
void td__py_float_repr(double f, char *out, size_t cap);
/* Python's str.isspace() for one code point. */
bool td__py_isspace(uint32_t cp);
/* Number of code points in valid UTF-8. */
size_t td__utf8_count(const char *p, size_t n);
/* Byte offset of code point `idx` (idx <= count). */
size_t td__utf8_offset(const char *p, size_t n, size_t idx);

/* ---- lexer ----------------------------------------------------------------------------------- */

typedef enum jtok_type {
    JT_EOF = 0,
    JT_DATA,        /* template text (whitespace control already applied) */
    JT_VAR_BEGIN,   /* {{ */
    JT_VAR_END,     /* }} */
    JT_BLOCK_BEGIN, /* {% */
    JT_BLOCK_END,   /* %} */
    JT_NAME,
    JT_STRING,      /* escapes decoded */
    JT_INT,
    JT_FLOAT,
    JT_OP,          /* op[] holds it: + - * / // % ** ~ ( ) [ ] { } , . : | = == != < > <= >= */
} jtok_type_t;

typedef struct jtok {
    jtok_type_t t;
    int line, col;
    const jstr_t *s; /* JT_DATA, JT_NAME, JT_STRING */
    int64_t i;
    double f;
    char op[3];
} jtok_t;

typedef struct jparse_ctx {
    jarena_t *ar;
    const char *what;
    jmp_buf jb;
    int err;
} jparse_ctx_t;

/* Tokenize; unwinds through pc->jb with td_err_set on error. */
void td__jinja_lex(jparse_ctx_t *pc, const char *src, size_t len, jtok_t **toks, size_t *n);
/* Record a parse error at line:col and unwind. */
_Noreturn void td__jinja_parse_fail(jparse_ctx_t *pc, int code, int line, int col,
                                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* ---- tree ------------------------------------------------------------------------------------ */

typedef enum node_kind {
    /* statements */
    N_DATA,      /* lit */
    N_OUTPUT,    /* {{ a }} */
    N_IF,        /* a: condition, body, orelse */
    N_FOR,       /* a: target, b: iterable, c: filter condition or NULL, body, orelse */
    N_SET,       /* a: target, b: value */
    N_SETBLOCK,  /* a: target, body; c: filter chain (operand NULL) or NULL */
    N_MACRO,     /* name, params/defaults (args, kwnames), body */
    N_FILTERBLK, /* c: filter chain applied to the body's output */
    N_BREAK,
    N_CONTINUE,
    /* expressions */
    N_CONST,   /* lit */
    N_NAME,    /* name */
    N_ATTR,    /* a.name */
    N_ITEM,    /* a[b] */
    N_SLICE,   /* a[args[0]:args[1]:args[2]], NULLs for omitted */
    N_CALL,    /* a(args, kwnames=kwargs) */
    N_FILTER,  /* a | name(args, kw) ; a NULL inside filter blocks */
    N_TEST,    /* a is [not] name(args); neg */
    N_BINOP,   /* a op b: + - * / // % ** ~ */
    N_CMP,     /* a op b: == != < > <= >= in notin */
    N_AND,
    N_OR,
    N_NOT,
    N_NEG,
    N_POS,
    N_COND,    /* b if a else c (c NULL: undefined) */
    N_LIST,    /* args */
    N_TUPLE,   /* args */
    N_DICT,    /* args: keys, kwargs: values */
} node_kind_t;

struct node {
    node_kind_t kind;
    int line;
    char op[6]; /* N_BINOP / N_CMP operator */
    bool neg;   /* N_TEST: `is not` */
    node_t *a, *b, *c;
    const jstr_t *name;
    jv_t lit;
    node_t **body, **orelse;  /* statement lists */
    size_t n_body, n_orelse;
    node_t **args;            /* expressions */
    size_t n_args;
    const jstr_t **kwnames;   /* [n_kw] keyword names (N_CALL/N_FILTER/N_TEST), macro params */
    node_t **kwargs;          /* [n_kw] values (NULL entries: macro params without default) */
    size_t n_kw;
};

struct td_jinja {
    jarena_t ar;
    char *what;   /* heap: the source's name for messages */
    node_t **body;
    size_t n_body;
};

void td__jinja_parse_tokens(jparse_ctx_t *pc, const jtok_t *toks, size_t n, node_t ***body,
                            size_t *n_body);

/* ---- rendering ------------------------------------------------------------------------------- */

typedef struct jscope jscope_t;
struct jscope {
    jscope_t *parent;
    jdict_t *vars;
};

struct jmacro {
    const node_t *def;
    jscope_t *closure;
};

struct jr {
    jarena_t ar;
    jmp_buf jb;
    int err;
    const td_jinja_t *tpl;
    jbuf_t *out;     /* where output goes now */
    size_t max_output;
    uint64_t steps, max_steps;
    unsigned depth, max_depth;
    int64_t now_s;
    int loopctl;     /* 0, 1 break, 2 continue */
    jscope_t *globals;
    jv_t hole;       /* the value a filter block or set block's filter chain applies to */
};

/* Fail the render at `at` (may be NULL) with code and message; unwinds. */
_Noreturn void td__jr_fail(jr_t *r, const node_t *at, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Mark this thread's render as failed by raise_exception (td_jinja_raised). */
void td__jr_set_raised(void);
/* Python's TypeError "what, not TYPE" (UndefinedError when v is undefined); unwinds. */
_Noreturn void td__jr_type_error(jr_t *r, const node_t *at, const char *what, jv_t v);
/* Count one step against the limit. */
void td__jr_step(jr_t *r, const node_t *at);

/* jinja_eval.c */
jscope_t *td__jr_scope_new(jr_t *r, jscope_t *parent);
void td__jr_exec_body(jr_t *r, jscope_t *s, node_t *const *body, size_t n);
void td__jr_clear_raised(void);
jv_t td__jr_eval(jr_t *r, jscope_t *s, const node_t *e);
jv_t td__jr_getattr(jr_t *r, const node_t *at, jv_t obj, const jstr_t *name);
jv_t td__jr_getitem(jr_t *r, const node_t *at, jv_t obj, jv_t key);
jv_t td__jr_call(jr_t *r, const node_t *at, jv_t fn, const jv_t *args, size_t n, jdict_t *kw);
/* Iterate: a list of the items `v` yields (dict: keys; str: characters). Undefined: empty. */
jlist_t *td__jr_iter(jr_t *r, const node_t *at, jv_t v);

/* jinja_filters.c */
jv_t td__jr_filter(jr_t *r, const node_t *at, const jstr_t *name, jv_t v, const jv_t *args,
                   size_t n, jdict_t *kw);
bool td__jr_test(jr_t *r, const node_t *at, const jstr_t *name, jv_t v, const jv_t *args,
                 size_t n);
bool td__jr_has_filter(const char *name);
bool td__jr_has_test(const char *name);
/* A bound method of a str/dict/list value, or an undefined value when there is none. */
jv_t td__jr_method(jr_t *r, jv_t obj, const jstr_t *name);
/* Python's str.strip(chars)/lstrip/rstrip (which: 1 left, 2 right, 3 both; chars NULL:
 * whitespace), str.replace (count < 0: all), str.splitlines, and case mapping (mode 1
 * capitalize, 2 Jinja's title filter, 3 lower, 4 upper, 5 str.title()). */
jv_t td__jr_strip(jr_t *r, const jstr_t *s, const jstr_t *chars, int which);
jv_t td__jr_replace(jr_t *r, const jstr_t *s, const jstr_t *old, const jstr_t *new_,
                    int64_t count);
jlist_t *td__jr_splitlines(jr_t *r, const jstr_t *s);
jv_t td__jr_recase(jr_t *r, const jstr_t *s, int mode);
/* `fmt % args` (args a tuple, or one value). */
jv_t td__jr_percent(jr_t *r, const node_t *at, const jstr_t *fmt, jv_t args);
/* Global functions: range, namespace, dict, raise_exception, strftime_now. */
void td__jr_add_globals(jr_t *r, jdict_t *g);

#endif
