/* jinja_lex.c: template source -> tokens, following Jinja2 3.1's lexer as transformers sets it
 * up: newlines normalized to \n, one trailing newline dropped (keep_trailing_newline off),
 * `{%-`/`-%}` strip all whitespace, `+` turns lstrip/trim off for that tag, lstrip_blocks strips
 * spaces and tabs from a line's start up to a block or comment tag, trim_blocks drops the first
 * newline after a block or comment tag. */
#include "jinja_impl.h"

#include "td_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lex {
    jparse_ctx_t *pc;
    const char *s; /* normalized source */
    size_t n, pos;
    jtok_t *toks;
    size_t n_toks, cap;
    bool line_starting;
    int depth; /* open ( [ { inside a tag */
    size_t pos_at; /* position() cache: byte offset and its line/column */
    int pos_line, pos_col;
} lex_t;

_Noreturn void td__jinja_parse_fail(jparse_ctx_t *pc, int code, int line, int col,
                                    const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pc->err = td_err_set(code, "%s:%d:%d: %s", pc->what, line, col, msg);
    longjmp(pc->jb, 1);
}

/* line and column (1-based, in code points) of byte offset `at` */
static void position(lex_t *lx, size_t at, int *line, int *col)
{
    int l = 1, c = 1;
    size_t i = 0;
    if (lx->pos_line > 0 && lx->pos_at <= at) {
        i = lx->pos_at;
        l = lx->pos_line;
        c = lx->pos_col;
    }
    for (; i < at && i < lx->n; i++) {
        if (lx->s[i] == '\n') {
            l++;
            c = 1;
        } else if (((unsigned char)lx->s[i] & 0xC0) != 0x80) {
            c++;
        }
    }
    lx->pos_at = i;
    lx->pos_line = l;
    lx->pos_col = c;
    *line = l;
    *col = c;
}

_Noreturn static void lex_fail(lex_t *lx, size_t at, const char *msg)
{
    int line, col;
    position(lx, at, &line, &col);
    td__jinja_parse_fail(lx->pc, TD_EPARSE, line, col, "%s", msg);
}

static jtok_t *emit(lex_t *lx, jtok_type_t t, size_t at)
{
    if (lx->n_toks == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 256;
        jtok_t *nt = td__jarena_alloc(lx->pc->ar, cap * sizeof(*nt));
        if (lx->n_toks)
            memcpy(nt, lx->toks, lx->n_toks * sizeof(*nt));
        lx->toks = nt;
        lx->cap = cap;
    }
    jtok_t *k = &lx->toks[lx->n_toks++];
    memset(k, 0, sizeof(*k));
    k->t = t;
    position(lx, at, &k->line, &k->col);
    return k;
}

static jstr_t *mkstr(lex_t *lx, const char *p, size_t n)
{
    jstr_t *s = td__jarena_alloc(lx->pc->ar, sizeof(*s) + n + 1);
    s->n = n;
    if (n)
        memcpy(s->p, p, n);
    s->p[n] = '\0';
    return s;
}

/* Length of the whitespace code point at p (0 if none), Python's isspace. */
static size_t ws_len(const char *p, size_t n)
{
    if (n == 0)
        return 0;
    size_t k = td_utf8_valid_len((const uint8_t *)p, n);
    if (k == 0)
        return 0;
    return td__py_isspace(td_utf8_decode((const uint8_t *)p, k)) ? k : 0;
}

static size_t skip_ws(const char *s, size_t n, size_t pos)
{
    size_t k;
    while (pos < n && (k = ws_len(s + pos, n - pos)) > 0)
        pos += k;
    return pos;
}

/* Python's str.rstrip() length of s[0..n) */
static size_t rstrip_len(const char *s, size_t n)
{
    while (n > 0) {
        size_t k = 1;
        while (k < 4 && k < n && ((unsigned char)s[n - k] & 0xC0) == 0x80)
            k++;
        if (ws_len(s + n - k, k) != k)
            break;
        n -= k;
    }
    return n;
}

static void emit_data(lex_t *lx, size_t at, size_t n)
{
    if (n == 0)
        return;
    jtok_t *k = emit(lx, JT_DATA, at);
    k->s = mkstr(lx, lx->s + at, n);
}

/* Data before a tag: apply `-` or lstrip_blocks. */
static void emit_text_before(lex_t *lx, size_t start, size_t end, char sign, bool block_like)
{
    size_t n = end - start;
    const char *t = lx->s + start;
    if (sign == '-') {
        n = rstrip_len(t, n);
    } else if (sign != '+' && block_like) {
        size_t l_pos = 0;
        for (size_t i = n; i-- > 0;)
            if (t[i] == '\n') {
                l_pos = i + 1;
                break;
            }
        if (l_pos > 0 || lx->line_starting) {
            size_t p = l_pos;
            p = skip_ws(t, n, p);
            if (p == n)
                n = l_pos;
        }
    }
    emit_data(lx, start, n);
}

static uint32_t hexval(const char *p, size_t k, bool *ok)
{
    uint32_t v = 0;
    for (size_t i = 0; i < k; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) {
            *ok = false;
            return 0;
        }
        v = v * 16 + (uint32_t)d;
    }
    return v;
}

/* A string literal at lx->pos (quote there): Python's unicode-escape decoding of its body. */
static void lex_string(lex_t *lx)
{
    size_t at = lx->pos;
    char q = lx->s[at];
    size_t i = at + 1;
    while (i < lx->n && lx->s[i] != q) {
        if (lx->s[i] == '\\' && i + 1 < lx->n)
            i++;
        i++;
    }
    if (i >= lx->n)
        lex_fail(lx, at, "unterminated string literal");
    const char *p = lx->s + at + 1;
    size_t n = i - at - 1;
    char *o = td__jarena_alloc(lx->pc->ar, n + 1);
    size_t w = 0;
    for (size_t k = 0; k < n; k++) {
        if (p[k] != '\\' || k + 1 >= n) {
            o[w++] = p[k];
            continue;
        }
        char c = p[++k];
        uint32_t cp;
        size_t hex = 0;
        bool ok = true;
        switch (c) {
        case '\n': continue;
        case '\\': o[w++] = '\\'; continue;
        case '\'': o[w++] = '\''; continue;
        case '"': o[w++] = '"'; continue;
        case 'a': o[w++] = '\a'; continue;
        case 'b': o[w++] = '\b'; continue;
        case 'f': o[w++] = '\f'; continue;
        case 'n': o[w++] = '\n'; continue;
        case 'r': o[w++] = '\r'; continue;
        case 't': o[w++] = '\t'; continue;
        case 'v': o[w++] = '\v'; continue;
        case 'N': lex_fail(lx, at, "\\N{...} escapes are not supported");
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        default:
            if (c >= '0' && c <= '7') {
                cp = 0;
                size_t d = 0;
                while (d < 3 && k < n && p[k] >= '0' && p[k] <= '7') {
                    cp = cp * 8 + (uint32_t)(p[k] - '0');
                    k++;
                    d++;
                }
                k--;
                w += td_utf8_encode(cp, o + w);
                continue;
            }
            o[w++] = '\\'; /* unknown escape: kept as written */
            o[w++] = c;
            continue;
        }
        if (k + hex >= n)
            ok = false;
        cp = ok ? hexval(p + k + 1, hex, &ok) : 0;
        if (!ok || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            lex_fail(lx, at, "invalid \\x, \\u or \\U escape in string literal");
        k += hex;
        w += td_utf8_encode(cp, o + w);
    }
    jtok_t *t = emit(lx, JT_STRING, at);
    jstr_t *s = td__jarena_alloc(lx->pc->ar, sizeof(*s) + w + 1);
    memcpy(s->p, o, w);
    s->p[w] = '\0';
    s->n = w;
    t->s = s;
    lx->pos = i + 1;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static void lex_number(lex_t *lx)
{
    size_t at = lx->pos, i = at;
    char buf[128];
    size_t w = 0;
    bool is_float = false;
    while (i < lx->n && (is_digit(lx->s[i]) || (lx->s[i] == '_' && i + 1 < lx->n &&
                                                 is_digit(lx->s[i + 1]))))
        i++;
    size_t int_end = i;
    if (i + 1 < lx->n && lx->s[i] == '.' && is_digit(lx->s[i + 1])) {
        is_float = true;
        i++;
        while (i < lx->n && (is_digit(lx->s[i]) || lx->s[i] == '_'))
            i++;
    }
    if (i < lx->n && (lx->s[i] == 'e' || lx->s[i] == 'E')) {
        size_t j = i + 1;
        if (j < lx->n && (lx->s[j] == '+' || lx->s[j] == '-'))
            j++;
        if (j < lx->n && is_digit(lx->s[j])) {
            is_float = true;
            i = j;
            while (i < lx->n && is_digit(lx->s[i]))
                i++;
        }
    }
    if (!is_float && lx->s[at] == '0') { /* Jinja's integers: [1-9](_?\d)* or 0(_?0)* */
        i = at + 1;
        while (i < int_end && (lx->s[i] == '0' || lx->s[i] == '_'))
            i++;
    }
    for (size_t k = at; k < i; k++)
        if (lx->s[k] != '_' && w + 1 < sizeof(buf))
            buf[w++] = lx->s[k];
    buf[w] = '\0';
    jtok_t *t = emit(lx, is_float ? JT_FLOAT : JT_INT, at);
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else if (td_parse_i64(buf, &t->i) != 0) {
        lex_fail(lx, at, "integer literal out of range");
    }
    lx->pos = i;
}

/* Tokens of one tag up to its end marker (`}}` or `%}`); returns the sign before the end. */
static char lex_tag(lex_t *lx, char end_ch, size_t start)
{
    lx->depth = 0;
    for (;;) {
        lx->pos = skip_ws(lx->s, lx->n, lx->pos);
        if (lx->pos >= lx->n)
            lex_fail(lx, start, end_ch == '}' ? "unclosed '{{' (expected '}}')"
                                              : "unclosed '{%' (expected '%}')");
        const char *p = lx->s + lx->pos;
        size_t left = lx->n - lx->pos;
        if (lx->depth == 0) {
            if (left >= 2 && p[0] == end_ch && p[1] == '}') {
                lx->pos += 2;
                return 0;
            }
            /* `-%}` `+%}` `-}}`: Jinja has no `+}}` */
            if (left >= 3 && (p[0] == '-' || (p[0] == '+' && end_ch == '%')) &&
                p[1] == end_ch && p[2] == '}') {
                lx->pos += 3;
                return p[0];
            }
        }
        char c = p[0];
        if (c == '\'' || c == '"') {
            lex_string(lx);
        } else if (is_digit(c)) {
            lex_number(lx);
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t i = lx->pos;
            while (i < lx->n && ((lx->s[i] >= 'a' && lx->s[i] <= 'z') ||
                                 (lx->s[i] >= 'A' && lx->s[i] <= 'Z') || lx->s[i] == '_' ||
                                 is_digit(lx->s[i])))
                i++;
            jtok_t *t = emit(lx, JT_NAME, lx->pos);
            t->s = mkstr(lx, p, i - lx->pos);
            lx->pos = i;
        } else {
            static const char *const two[] = {"//", "**", "==", "!=", "<=", ">="};
            size_t len = 0;
            for (size_t k = 0; k < TD_ARRAY_LEN(two); k++)
                if (left >= 2 && p[0] == two[k][0] && p[1] == two[k][1])
                    len = 2;
            if (len == 0 && strchr("+-*/%~()[]{},.:|=<>;", c) && c != '\0')
                len = 1;
            if (len == 0) {
                char m[64];
                snprintf(m, sizeof(m), "unexpected character '%c'", c);
                lex_fail(lx, lx->pos, (unsigned char)c < 0x80 && c >= 0x20
                                          ? m
                                          : "unexpected character");
            }
            if (c == '(' || c == '[' || c == '{')
                lx->depth++;
            else if ((c == ')' || c == ']' || c == '}') && lx->depth > 0)
                lx->depth--;
            jtok_t *t = emit(lx, JT_OP, lx->pos);
            memcpy(t->op, p, len);
            lx->pos += len;
        }
    }
}

/* After a block or comment end: `-` strips whitespace, trim_blocks drops one newline. */
static void after_block_end(lex_t *lx, char sign)
{
    if (sign == '-') {
        lx->pos = skip_ws(lx->s, lx->n, lx->pos);
        lx->line_starting = lx->pos > 0 && lx->s[lx->pos - 1] == '\n';
    } else if (sign != '+' && lx->pos < lx->n && lx->s[lx->pos] == '\n') {
        lx->pos++;
        lx->line_starting = true;
    } else {
        lx->line_starting = false;
    }
}

/* `{% raw %}` at lx->pos (after the opener and its sign)? Returns the end of its begin tag. */
static bool match_word_tag(const lex_t *lx, size_t i, const char *word, size_t *end, char *sign)
{
    i = skip_ws(lx->s, lx->n, i);
    size_t w = strlen(word);
    if (i + w > lx->n || memcmp(lx->s + i, word, w) != 0)
        return false;
    i += w;
    if (i < lx->n && ((lx->s[i] >= 'a' && lx->s[i] <= 'z') || lx->s[i] == '_'))
        return false;
    i = skip_ws(lx->s, lx->n, i);
    *sign = 0;
    if (i < lx->n && (lx->s[i] == '-' || lx->s[i] == '+'))
        *sign = lx->s[i++];
    if (i + 2 > lx->n || lx->s[i] != '%' || lx->s[i + 1] != '}')
        return false;
    *end = i + 2;
    return true;
}

static void lex_raw(lex_t *lx, size_t tag_at, size_t body)
{
    for (size_t i = body; i + 1 < lx->n; i++) {
        if (lx->s[i] != '{' || lx->s[i + 1] != '%')
            continue;
        size_t j = i + 2, end;
        char open_sign = 0, sign;
        if (j < lx->n && (lx->s[j] == '-' || lx->s[j] == '+'))
            open_sign = lx->s[j++];
        if (!match_word_tag(lx, j, "endraw", &end, &sign))
            continue;
        size_t n = i - body;
        if (open_sign == '-')
            n = rstrip_len(lx->s + body, n);
        emit_data(lx, body, n);
        lx->pos = end;
        after_block_end(lx, sign);
        return;
    }
    lex_fail(lx, tag_at, "unclosed raw block (expected '{% endraw %}')");
}

static void normalize(lex_t *lx, const char *src, size_t len)
{
    char *o = td__jarena_alloc(lx->pc->ar, len + 1);
    size_t w = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            o[w++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            o[w++] = src[i];
        }
    }
    if (w > 0 && o[w - 1] == '\n')
        w--;
    o[w] = '\0';
    lx->s = o;
    lx->n = w;
}

void td__jinja_lex(jparse_ctx_t *pc, const char *src, size_t len, jtok_t **toks, size_t *n)
{
    lex_t lx = {.pc = pc, .line_starting = true};
    normalize(&lx, src, len);
    while (lx.pos < lx.n) {
        const char *hit = NULL;
        for (const char *q = memchr(lx.s + lx.pos, '{', lx.n - lx.pos); q;
             q = memchr(q + 1, '{', (size_t)(lx.s + lx.n - q - 1))) {
            if (q + 1 < lx.s + lx.n && (q[1] == '{' || q[1] == '%' || q[1] == '#')) {
                hit = q;
                break;
            }
            if (q + 1 >= lx.s + lx.n)
                break;
        }
        if (!hit) {
            emit_data(&lx, lx.pos, lx.n - lx.pos);
            break;
        }
        size_t tag = (size_t)(hit - lx.s), i = tag + 2;
        char kind = hit[1], sign = 0;
        if (i < lx.n && (lx.s[i] == '-' || lx.s[i] == '+'))
            sign = lx.s[i++];
        size_t raw_end;
        char raw_sign;
        if (kind == '%' && match_word_tag(&lx, i, "raw", &raw_end, &raw_sign)) {
            emit_text_before(&lx, lx.pos, tag, sign, true);
            size_t body = raw_end;
            if (raw_sign == '-')
                body = skip_ws(lx.s, lx.n, body);
            if (body >= lx.n) /* as above: nothing left after the tag */
                break;
            lex_raw(&lx, tag, body);
            continue;
        }
        emit_text_before(&lx, lx.pos, tag, sign, kind != '{');
        if (i >= lx.n && kind == '#') /* a comment opening at the very end: Jinja stops there */
            break;
        if (kind == '#') {
            size_t j = i;
            for (; j + 1 < lx.n; j++)
                if (lx.s[j] == '#' && lx.s[j + 1] == '}')
                    break;
            if (j + 1 >= lx.n)
                lex_fail(&lx, tag, "unclosed comment (expected '#}')");
            char esign = j > i && (lx.s[j - 1] == '-' || lx.s[j - 1] == '+') ? lx.s[j - 1] : 0;
            lx.pos = j + 2;
            after_block_end(&lx, esign);
            continue;
        }
        emit(&lx, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, tag);
        lx.pos = i;
        char esign = lex_tag(&lx, kind == '{' ? '}' : '%', tag);
        emit(&lx, kind == '{' ? JT_VAR_END : JT_BLOCK_END, lx.pos - 2);
        if (kind == '{') {
            if (esign == '-')
                lx.pos = skip_ws(lx.s, lx.n, lx.pos);
            lx.line_starting = lx.pos > 0 && lx.s[lx.pos - 1] == '\n';
        } else {
            after_block_end(&lx, esign);
        }
    }
    emit(&lx, JT_EOF, lx.n);
    *toks = lx.toks;
    *n = lx.n_toks;
}
