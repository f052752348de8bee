/* jsonfsm.c: a JSON schema subset compiled into a byte-level pushdown automaton
 * (td_jsonfsm.h). */
#include "td_error.h"
#include "td_jsonfsm.h"
#include "td_util.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum kind { K_ANY, K_FREEOBJ, K_OBJ, K_ARR, K_STR, K_INT, K_NUM, K_LIT };
enum mode { F_VAL, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT };

/* fixed nodes every automaton has: any value and its parts */
enum { N_ANY, N_FREEOBJ, N_ANYARR, N_ANYSTR, N_ANYNUM, N_ANYLIT, N_FIXED };

typedef struct node {
    uint8_t kind;
    int n;            /* properties or literals */
    char **names;     /* OBJ: property names as JSON-escaped text; LIT: compact JSON texts */
    uint16_t *lens;
    uint16_t *child;  /* OBJ: the properties' nodes */
    uint64_t required;
    uint16_t items;   /* ARR */
    uint32_t min, max; /* ARR items, STR characters */
} node_t;

struct td_jsonfsm {
    node_t *nodes;
    int n_nodes;
    uint16_t root;
};

static char *lit_true[] = {"true", "false", "null"};
static uint16_t lit_lens[] = {4, 5, 4};

void td_jsonfsm_free(td_jsonfsm_t *f)
{
    if (!f)
        return;
    for (int i = N_FIXED; i < f->n_nodes; i++) {
        for (int k = 0; k < f->nodes[i].n; k++)
            free(f->nodes[i].names[k]);
        free(f->nodes[i].names);
        free(f->nodes[i].lens);
        free(f->nodes[i].child);
    }
    free(f->nodes);
    free(f);
}

/* ---- compiling ---------------------------------------------------------------------------- */

typedef struct cctx {
    td_jsonfsm_t *f;
    json_object *empty; /* {} for an object with required but no properties */
    char path[256];
} cctx_t;

static int cfail(cctx_t *c, int code, const char *fmt, const char *what)
{
    return td_err_set(code, fmt, c->path, what);
}

static int new_node(cctx_t *c, int kind)
{
    if (c->f->n_nodes >= TD_JSONFSM_MAX_NODES)
        return td_err_set(TD_EINVAL, "%s: the schema has more than %d nodes", c->path,
                           TD_JSONFSM_MAX_NODES);
    node_t *n = &c->f->nodes[c->f->n_nodes];
    memset(n, 0, sizeof(*n));
    n->kind = (uint8_t)kind;
    n->max = UINT32_MAX;
    return c->f->n_nodes++;
}

static int get_count(cctx_t *c, json_object *v, const char *kw, uint32_t *out)
{
    if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0 ||
        json_object_get_int64(v) > UINT32_MAX - 1)
        return cfail(c, TD_EINVAL, "%s.%s must be a non-negative integer", kw);
    *out = (uint32_t)json_object_get_int64(v);
    return 0;
}

static int compile(cctx_t *c, json_object *s, int depth);

static int compile_lits(cctx_t *c, node_t *n, json_object *arr, bool single)
{
    size_t cnt = single ? 1 : json_object_array_length(arr);
    if (cnt == 0 || cnt > TD_JSONFSM_MAX_PROPS)
        return cfail(c, TD_EINVAL, "%s: enum must hold 1 to 64 values%s", "");
    n->names = td_calloc(cnt, sizeof(char *));
    n->lens = td_calloc(cnt, sizeof(uint16_t));
    if (!n->names || !n->lens)
        return TD_ENOMEM;
    for (size_t i = 0; i < cnt; i++) {
        json_object *v = single ? arr : json_object_array_get_idx(arr, i);
        const char *t = json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN |
                                                              JSON_C_TO_STRING_NOSLASHESCAPE);
        size_t l = strlen(t);
        if (l > 1024)
            return cfail(c, TD_EINVAL, "%s: an enum value longer than 1024 bytes%s", "");
        n->names[i] = td_strdup(t);
        if (!n->names[i])
            return TD_ENOMEM;
        n->lens[i] = (uint16_t)l;
        n->n = (int)i + 1;
    }
    return 0;
}

static int compile_object(cctx_t *c, int id, json_object *s, int depth)
{
    json_object *props = NULL, *req = NULL, *ap = NULL;
    json_object_object_get_ex(s, "properties", &props);
    json_object_object_get_ex(s, "required", &req);
    json_object_object_get_ex(s, "additionalProperties", &ap);
    if (ap && !json_object_is_type(ap, json_type_boolean))
        return cfail(c, TD_ENOTSUP, "%s.additionalProperties: only true or false is supported%s",
                     "");
    if (props && !json_object_is_type(props, json_type_object))
        return cfail(c, TD_EINVAL, "%s.properties must be an object%s", "");
    int np = props ? json_object_object_length(props) : 0;
    if (np > TD_JSONFSM_MAX_PROPS)
        return cfail(c, TD_ENOTSUP, "%s.properties: more than 64 properties%s", "");
    if (!props && !req) {
        /* no properties named: any object (extra properties are what it may hold) */
        c->f->nodes[id].kind = K_FREEOBJ;
        return 0;
    }
    if (!props)
        props = c->empty;
    node_t *n = &c->f->nodes[id];
    n->names = td_calloc((size_t)np + 1, sizeof(char *));
    n->lens = td_calloc((size_t)np + 1, sizeof(uint16_t));
    n->child = td_calloc((size_t)np + 1, sizeof(uint16_t));
    if (!n->names || !n->lens || !n->child)
        return TD_ENOMEM;
    size_t plen = strlen(c->path);
    int i = 0;
    json_object_object_foreach(props, key, val)
    {
        json_object *ks = json_object_new_string(key);
        const char *t = json_object_to_json_string_ext(ks, JSON_C_TO_STRING_PLAIN |
                                                               JSON_C_TO_STRING_NOSLASHESCAPE);
        size_t l = strlen(t);
        char *name = l >= 2 ? td_strndup(t + 1, l - 2) : NULL; /* without the quotes */
        json_object_put(ks);
        if (!name)
            return TD_ENOMEM;
        n = &c->f->nodes[id];
        n->names[i] = name;
        n->lens[i] = (uint16_t)TD_MIN(strlen(name), 65535);
        n->n = i + 1;
        snprintf(c->path + plen, sizeof(c->path) - plen, ".properties.%s", key);
        int ch = compile(c, val, depth + 1);
        c->path[plen] = '\0';
        if (ch < 0)
            return ch;
        n = &c->f->nodes[id]; /* nodes do not move (preallocated), but be plain about it */
        n->child[i++] = (uint16_t)ch;
    }
    if (req) {
        if (!json_object_is_type(req, json_type_array))
            return cfail(c, TD_EINVAL, "%s.required must be an array of names%s", "");
        for (size_t k = 0; k < json_object_array_length(req); k++) {
            const char *r = json_object_get_string(json_object_array_get_idx(req, k));
            int found = -1;
            json_object *probe;
            i = 0;
            json_object_object_foreach(props, key2, val2)
            {
                (void)val2;
                if (r && !strcmp(key2, r))
                    found = i;
                i++;
            }
            if (found < 0 || !json_object_is_type(json_object_array_get_idx(req, k),
                                                  json_type_string) ||
                !json_object_object_get_ex(props, r, &probe))
                return cfail(c, TD_EINVAL, "%s.required names \"%s\", not a property",
                             r ? r : "?");
            n->required |= 1ull << found;
        }
    }
    return 0;
}

static const char *const ignored[] = {"title", "description", "$schema", "default", "examples",
                                      "strict", "$comment", "type", "properties", "required",
                                      "additionalProperties", "items", "minItems", "maxItems",
                                      "minLength", "maxLength", "enum", "const", NULL};

/* Compile schema s: the node id, or a (negative) TD_E* code. */
static int compile(cctx_t *c, json_object *s, int depth)
{
    if (depth > TD_JSONFSM_MAX_DEPTH)
        return cfail(c, TD_ENOTSUP, "%s: nested deeper than the supported %s levels", "12");
    if (json_object_is_type(s, json_type_boolean) && json_object_get_boolean(s))
        return N_ANY;
    if (!json_object_is_type(s, json_type_object))
        return cfail(c, TD_EINVAL, "%s: a schema must be an object%s", "");
    json_object_object_foreach(s, kw, kv)
    {
        (void)kv;
        bool known = false;
        for (int i = 0; ignored[i]; i++)
            known |= !strcmp(ignored[i], kw);
        if (!known) {
            size_t l = strlen(c->path);
            snprintf(c->path + l, sizeof(c->path) - l, ".%s", kw);
            return cfail(c, TD_ENOTSUP, "%s: the schema keyword '%s' is not supported", kw);
        }
    }
    json_object *v, *type = NULL;
    int rc;
    bool single = json_object_object_get_ex(s, "const", &v);
    if (single || json_object_object_get_ex(s, "enum", &v)) {
        if (!single && !json_object_is_type(v, json_type_array))
            return cfail(c, TD_EINVAL, "%s.enum must be an array%s", "");
        int id = new_node(c, K_LIT);
        if (id < 0)
            return id;
        rc = compile_lits(c, &c->f->nodes[id], v, single);
        return rc ? rc : id;
    }
    json_object_object_get_ex(s, "type", &type);
    if (!type)
        return N_ANY;
    if (!json_object_is_type(type, json_type_string))
        return cfail(c, TD_ENOTSUP, "%s.type: only a single type name is supported%s", "");
    const char *t = json_object_get_string(type);
    int id;
    if (!strcmp(t, "object")) {
        if ((id = new_node(c, K_OBJ)) < 0)
            return id;
        rc = compile_object(c, id, s, depth);
        return rc ? rc : id;
    }
    if (!strcmp(t, "array")) {
        if ((id = new_node(c, K_ARR)) < 0)
            return id;
        node_t *n = &c->f->nodes[id];
        n->items = N_ANY;
        if (json_object_object_get_ex(s, "minItems", &v) && (rc = get_count(c, v, "minItems", &n->min)))
            return rc;
        if (json_object_object_get_ex(s, "maxItems", &v) && (rc = get_count(c, v, "maxItems", &n->max)))
            return rc;
        if (json_object_object_get_ex(s, "items", &v)) {
            size_t l = strlen(c->path);
            snprintf(c->path + l, sizeof(c->path) - l, ".items");
            int ch = compile(c, v, depth + 1);
            c->path[l] = '\0';
            if (ch < 0)
                return ch;
            c->f->nodes[id].items = (uint16_t)ch;
        }
        n = &c->f->nodes[id];
        if (n->min > n->max)
            return cfail(c, TD_EINVAL, "%s: minItems exceeds maxItems%s", "");
        return id;
    }
    if (!strcmp(t, "string")) {
        if ((id = new_node(c, K_STR)) < 0)
            return id;
        node_t *n = &c->f->nodes[id];
        if (json_object_object_get_ex(s, "minLength", &v) && (rc = get_count(c, v, "minLength", &n->min)))
            return rc;
        if (json_object_object_get_ex(s, "maxLength", &v) && (rc = get_count(c, v, "maxLength", &n->max)))
            return rc;
        if (n->min > n->max)
            return cfail(c, TD_EINVAL, "%s: minLength exceeds maxLength%s", "");
        return id;
    }
    if (!strcmp(t, "integer") || !strcmp(t, "number"))
        return new_node(c, t[0] == 'i' ? K_INT : K_NUM);
    if (!strcmp(t, "boolean") || !strcmp(t, "null")) {
        if ((id = new_node(c, K_LIT)) < 0)
            return id;
        node_t *n = &c->f->nodes[id];
        bool b = t[0] == 'b';
        n->names = td_calloc(2, sizeof(char *));
        n->lens = td_calloc(2, sizeof(uint16_t));
        if (!n->names || !n->lens)
            return TD_ENOMEM;
        for (int i = 0; i < (b ? 2 : 1); i++) {
            n->names[i] = td_strdup(lit_true[b ? i : 2]);
            if (!n->names[i])
                return TD_ENOMEM;
            n->lens[i] = lit_lens[b ? i : 2];
            n->n = i + 1;
        }
        return id;
    }
    return cfail(c, TD_ENOTSUP, "%s.type: '%s' is not a JSON schema type", t);
}

int td_jsonfsm_compile(const char *schema, size_t len, td_jsonfsm_t **out)
{
    *out = NULL;
    td_jsonfsm_t *f = td_calloc(1, sizeof(*f));
    if (!f || !(f->nodes = td_calloc(TD_JSONFSM_MAX_NODES, sizeof(node_t)))) {
        free(f);
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    node_t *n = f->nodes;
    n[N_ANY].kind = K_ANY;
    n[N_FREEOBJ].kind = K_FREEOBJ;
    n[N_ANYARR].kind = K_ARR;
    n[N_ANYARR].items = N_ANY;
    n[N_ANYARR].max = UINT32_MAX;
    n[N_ANYSTR].kind = K_STR;
    n[N_ANYSTR].max = UINT32_MAX;
    n[N_ANYNUM].kind = K_NUM;
    n[N_ANYLIT].kind = K_LIT;
    n[N_ANYLIT].n = 3;
    n[N_ANYLIT].names = lit_true;
    n[N_ANYLIT].lens = lit_lens;
    f->n_nodes = N_FIXED;
    if (!schema) {
        f->root = N_FREEOBJ;
        *out = f;
        return 0;
    }
    json_tokener *tk = json_tokener_new();
    if (!tk) {
        td_jsonfsm_free(f);
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    json_tokener_set_flags(tk, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *s = json_tokener_parse_ex(tk, schema, (int)len);
    bool ok = json_tokener_get_error(tk) == json_tokener_success &&
              json_tokener_get_parse_end(tk) == len;
    json_tokener_free(tk);
    if (!ok) {
        json_object_put(s);
        td_jsonfsm_free(f);
        return td_err_set(TD_EPARSE, "schema: not valid JSON");
    }
    cctx_t c = {f, json_object_new_object(), "schema"};
    int root = c.empty ? compile(&c, s, 0) : td_err_set(TD_ENOMEM, "out of memory");
    json_object_put(c.empty);
    json_object_put(s);
    if (root < 0) {
        td_jsonfsm_free(f);
        return root;
    }
    f->root = (uint16_t)root;
    *out = f;
    return 0;
}

/* ---- running ------------------------------------------------------------------------------ */

void td_jsonfsm_start(const td_jsonfsm_t *f, td_jsonfsm_state_t *s)
{
    memset(s, 0, sizeof(*s));
    s->depth = 1;
    s->f[0].node = f->root;
    s->f[0].mode = F_VAL;
}

size_t td_jsonfsm_state_size(const td_jsonfsm_state_t *s)
{
    return offsetof(td_jsonfsm_state_t, f) + (size_t)s->depth * sizeof(td_jsonfsm_frame_t);
}

static bool push(td_jsonfsm_state_t *s, uint16_t node)
{
    if (s->depth >= TD_JSONFSM_MAX_DEPTH + 2)
        return false;
    td_jsonfsm_frame_t *fr = &s->f[s->depth++];
    memset(fr, 0, sizeof(*fr));
    fr->node = node;
    fr->mode = F_VAL;
    return true;
}

/* The top frame's value is complete: pop it and advance the parent. */
static void complete(const td_jsonfsm_t *f, td_jsonfsm_state_t *s)
{
    s->depth--;
    if (!s->depth) {
        s->done = true;
        return;
    }
    td_jsonfsm_frame_t *p = &s->f[s->depth - 1];
    if (p->mode == F_OBJ)
        p->sub = p->sub == 10 ? 2 : 4; /* a free key read, or a value */
    else if (p->mode == F_ARR) {
        p->sub = 1;
        const node_t *n = &f->nodes[p->node];
        /* without maxItems only "at least minItems" matters: equal states share cached masks */
        if (n->max != UINT32_MAX || p->count < n->min)
            p->count++;
    }
}

/* One more character of a string; without maxLength only "at least minLength" matters, so the
 * count stops there and equal states share cached masks. */
static void count_char(const node_t *n, td_jsonfsm_frame_t *fr)
{
    if (n->max != UINT32_MAX || fr->count < n->min)
        fr->count++;
}

static bool all_required(const node_t *n, const td_jsonfsm_frame_t *fr)
{
    return n->kind != K_OBJ || (fr->seen & n->required) == n->required;
}

static bool num_complete(uint8_t sub)
{
    return sub == 2 || sub == 3 || sub == 5 || sub == 8;
}

static bool lit_complete(const node_t *n, const td_jsonfsm_frame_t *fr)
{
    for (int i = 0; i < n->n; i++)
        if ((fr->cand >> i & 1) && n->lens[i] == fr->pos)
            return true;
    return false;
}

static bool is_digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static bool is_hex(uint8_t c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* A new key of a schema object: candidates are the properties not given yet. */
static bool begin_key(const node_t *n, td_jsonfsm_frame_t *fr)
{
    uint64_t all = n->n >= 64 ? ~0ull : (1ull << n->n) - 1;
    fr->cand = all & ~fr->seen;
    fr->pos = 0;
    fr->sub = 1;
    return fr->cand != 0;
}

bool td_jsonfsm_byte(const td_jsonfsm_t *f, td_jsonfsm_state_t *s, uint8_t c)
{
    if (s->dead)
        return false;
    for (;;) {
        if (s->done || !s->depth)
            goto reject;
        td_jsonfsm_frame_t *fr = &s->f[s->depth - 1];
        const node_t *n = &f->nodes[fr->node];
        switch (fr->mode) {
        case F_VAL:
            if (n->kind == K_ANY) {
                fr->node = c == '{'                  ? N_FREEOBJ
                           : c == '['                ? N_ANYARR
                           : c == '"'                ? N_ANYSTR
                           : c == '-' || is_digit(c) ? N_ANYNUM
                                                     : N_ANYLIT;
                n = &f->nodes[fr->node];
            }
            switch (n->kind) {
            case K_OBJ:
            case K_FREEOBJ:
                if (c != '{' || s->depth > TD_JSONFSM_MAX_DEPTH)
                    goto reject;
                fr->mode = F_OBJ;
                fr->sub = 0;
                return true;
            case K_ARR:
                if (c != '[' || s->depth > TD_JSONFSM_MAX_DEPTH)
                    goto reject;
                fr->mode = F_ARR;
                fr->sub = 0;
                return true;
            case K_STR:
                if (c != '"')
                    goto reject;
                fr->mode = F_STR;
                fr->sub = 0;
                return true;
            case K_INT:
            case K_NUM:
                fr->mode = F_NUM;
                fr->sub = 0;
                continue;
            default:
                fr->mode = F_LIT;
                fr->cand = n->n >= 64 ? ~0ull : (1ull << n->n) - 1;
                fr->pos = 0;
                continue;
            }
        case F_OBJ:
            switch (fr->sub) {
            case 0:
            case 5:
                if (c == '}' && fr->sub == 0) {
                    if (!all_required(n, fr))
                        goto reject;
                    complete(f, s);
                    return true;
                }
                if (c != '"')
                    goto reject;
                if (n->kind == K_FREEOBJ) {
                    fr->sub = 10;
                    if (!push(s, N_ANYSTR))
                        goto reject;
                    s->f[s->depth - 1].mode = F_STR;
                    return true;
                }
                if (!begin_key(n, fr))
                    goto reject;
                return true;
            case 1: {
                if (c == '"') {
                    for (int i = 0; i < n->n; i++)
                        if ((fr->cand >> i & 1) && n->lens[i] == fr->pos) {
                            fr->prop = (uint8_t)i;
                            fr->seen |= 1ull << i;
                            fr->sub = 2;
                            return true;
                        }
                    goto reject;
                }
                uint64_t next = 0;
                for (int i = 0; i < n->n; i++)
                    if ((fr->cand >> i & 1) && n->lens[i] > fr->pos &&
                        (uint8_t)n->names[i][fr->pos] == c)
                        next |= 1ull << i;
                if (!next)
                    goto reject;
                fr->cand = next;
                fr->pos++;
                return true;
            }
            case 2:
                if (c != ':')
                    goto reject;
                fr->sub = 3;
                return true;
            case 3:
                if (!push(s, n->kind == K_FREEOBJ ? N_ANY : n->child[fr->prop]))
                    goto reject;
                continue;
            case 4:
                if (c == ',') {
                    if (n->kind == K_OBJ && (n->n >= 64 ? ~0ull : (1ull << n->n) - 1) == fr->seen)
                        goto reject; /* no property left to give */
                    fr->sub = 5;
                    return true;
                }
                if (c == '}' && all_required(n, fr)) {
                    complete(f, s);
                    return true;
                }
                goto reject;
            default:
                goto reject;
            }
        case F_ARR:
            switch (fr->sub) {
            case 0:
                if (c == ']') {
                    if (n->min > 0)
                        goto reject;
                    complete(f, s);
                    return true;
                }
                if (n->max == 0)
                    goto reject;
                /* fall through */
            case 2:
                if (!push(s, n->items))
                    goto reject;
                continue;
            case 1:
                if (c == ',' && fr->count < n->max) {
                    fr->sub = 2;
                    return true;
                }
                if (c == ']' && fr->count >= n->min) {
                    complete(f, s);
                    return true;
                }
                goto reject;
            default:
                goto reject;
            }
        case F_STR:
            if (fr->u8) {
                if (c < 0x80 || c > 0xBF)
                    goto reject;
                fr->u8--;
                return true;
            }
            switch (fr->sub) {
            case 0:
                if (c == '"') {
                    if (fr->count < n->min)
                        goto reject;
                    complete(f, s);
                    return true;
                }
                if (c < 0x20 || c == 0x7F || fr->count >= n->max)
                    goto reject;
                if (c == '\\') {
                    fr->sub = 1;
                    return true;
                }
                if (c >= 0x80) {
                    if (c >= 0xC2 && c <= 0xDF)
                        fr->u8 = 1;
                    else if (c >= 0xE0 && c <= 0xEF)
                        fr->u8 = 2;
                    else if (c >= 0xF0 && c <= 0xF4)
                        fr->u8 = 3;
                    else
                        goto reject;
                }
                count_char(n, fr);
                return true;
            case 1:
                if (c == 'u') {
                    fr->sub = 2;
                    count_char(n, fr);
                    return true;
                }
                if (!strchr("\"\\/bfnrt", c) || !c)
                    goto reject;
                fr->sub = 0;
                count_char(n, fr);
                return true;
            default: /* 2..5: \u's four hex digits */
                if (!is_hex(c))
                    goto reject;
                fr->sub = fr->sub == 5 ? 0 : fr->sub + 1;
                return true;
            }
        case F_NUM: {
            bool integer = n->kind == K_INT;
            uint8_t st = fr->sub, to = 0xFF;
            switch (st) {
            case 0: to = c == '-' ? 1 : c == '0' ? 2 : is_digit(c) ? 3 : 0xFF; break;
            case 1: to = c == '0' ? 2 : is_digit(c) ? 3 : 0xFF; break;
            case 2:
            case 3:
            case 5:
                if (is_digit(c) && st != 2)
                    to = st;
                else if (c == '.' && st != 5 && !integer)
                    to = 4;
                else if ((c == 'e' || c == 'E') && !integer)
                    to = 6;
                break;
            case 4: to = is_digit(c) ? 5 : 0xFF; break;
            case 6: to = c == '+' || c == '-' ? 7 : is_digit(c) ? 8 : 0xFF; break;
            case 7: to = is_digit(c) ? 8 : 0xFF; break;
            case 8: to = is_digit(c) ? 8 : 0xFF; break;
            }
            if (to != 0xFF) {
                /* digits per part: 16 before the point and after it, 3 in the exponent */
                if (to == 3 || to == 5 || to == 8) {
                    fr->count = to == st ? fr->count + 1 : 1;
                    if (fr->count > (to == 8 ? 3u : 16u))
                        goto reject;
                }
                fr->sub = to;
                return true;
            }
            if (!num_complete(st))
                goto reject;
            complete(f, s);
            continue; /* the byte belongs to the parent */
        }
        case F_LIT: {
            uint64_t next = 0;
            for (int i = 0; i < n->n; i++)
                if ((fr->cand >> i & 1) && n->lens[i] > fr->pos &&
                    (uint8_t)n->names[i][fr->pos] == c)
                    next |= 1ull << i;
            if (!next) {
                if (!lit_complete(n, fr))
                    goto reject;
                complete(f, s);
                continue;
            }
            fr->cand = next;
            fr->pos++;
            /* complete now when no candidate is longer (a string, object or array literal) */
            bool longer = false;
            for (int i = 0; i < n->n; i++)
                longer |= (next >> i & 1) && n->lens[i] > fr->pos;
            if (!longer)
                complete(f, s);
            return true;
        }
        default:
            goto reject;
        }
    }
reject:
    s->dead = true;
    return false;
}

bool td_jsonfsm_plain_string(const td_jsonfsm_t *f, const td_jsonfsm_state_t *s)
{
    if (s->dead || s->done || !s->depth)
        return false;
    const td_jsonfsm_frame_t *fr = &s->f[s->depth - 1];
    const node_t *n = &f->nodes[fr->node];
    return fr->mode == F_STR && fr->sub == 0 && fr->u8 == 0 && n->max == UINT32_MAX &&
           fr->count >= n->min;
}

bool td_jsonfsm_feed(const td_jsonfsm_t *f, td_jsonfsm_state_t *s, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (!td_jsonfsm_byte(f, s, b[i]))
            return false;
    return true;
}

bool td_jsonfsm_complete(const td_jsonfsm_t *f, const td_jsonfsm_state_t *s)
{
    if (s->dead)
        return false;
    if (s->done)
        return true;
    if (s->depth != 1)
        return false;
    const td_jsonfsm_frame_t *fr = &s->f[0];
    if (fr->mode == F_NUM)
        return num_complete(fr->sub);
    if (fr->mode == F_LIT)
        return lit_complete(&f->nodes[fr->node], fr);
    return false;
}
