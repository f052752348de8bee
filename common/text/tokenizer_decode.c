/* tokenizer_decode.c: decoding ids to text, whole or one id at a time (td_detok_t), with
 * streaming UTF-8 repair of byte-level tokens. */
#include "td_error.h"
#include "tokenizer_impl.h"

#include <string.h>

void td_detok_init(td_detok_t *st, bool skip_special_tokens)
{
    memset(st, 0, sizeof(*st));
    st->skip_special = skip_special_tokens;
}

/* Streaming WHATWG UTF-8 decoding: complete characters out, U+FFFD for each maximal invalid
 * subpart, an incomplete tail held in st->part. */
static int emit_bytes(td_detok_t *st, const uint8_t *p, size_t n, td_buf_t *out)
{
    if (td_buf_reserve(out, n + 8))
        return TD_ENOMEM;
    for (size_t i = 0; i < n;) {
        uint8_t b = p[i];
        if (st->npart == 0) {
            size_t l = td_utf8_valid_len(p + i, n - i);
            if (l) {
                size_t j = i + l;
                while (j < n && (l = td_utf8_valid_len(p + j, n - j)))
                    j += l;
                if (td_buf_append(out, p + i, j - i))
                    return TD_ENOMEM;
                i = j;
                continue;
            }
            uint8_t need = b >= 0xC2 && b <= 0xDF   ? 2
                           : b >= 0xE0 && b <= 0xEF ? 3
                           : b >= 0xF0 && b <= 0xF4 ? 4
                                                    : 0;
            if (!need) {
                if (td_buf_append(out, "\xEF\xBF\xBD", 3))
                    return TD_ENOMEM;
            } else {
                st->part[0] = b;
                st->npart = 1;
                st->need = need;
            }
            i++;
            continue;
        }
        uint8_t lo = 0x80, hi = 0xBF, c = st->part[0];
        if (st->npart == 1) {
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
            else if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        }
        if (b < lo || b > hi) { /* the held bytes can never complete; b starts afresh */
            st->npart = 0;
            if (td_buf_append(out, "\xEF\xBF\xBD", 3))
                return TD_ENOMEM;
            continue;
        }
        st->part[st->npart++] = b;
        i++;
        if (st->npart == st->need) {
            if (td_buf_append(out, st->part, st->npart))
                return TD_ENOMEM;
            st->npart = 0;
        }
    }
    return 0;
}

int td_detok_finish(const td_tokenizer_t *tok, td_detok_t *st, td_buf_t *out)
{
    (void)tok;
    if (td_buf_reserve(out, 3))
        return TD_ENOMEM;
    if (st->npart) {
        st->npart = 0;
        return td_buf_append(out, "\xEF\xBF\xBD", 3);
    }
    return 0;
}

int td_detok_step(const td_tokenizer_t *tok, td_detok_t *st, int32_t id, td_buf_t *out)
{
    if (id < 0 || (size_t)id >= tok->nids ||
        (tok->ids[id].tok_len == UINT32_MAX && tok->ids[id].added < 0))
        return td_err_set(TD_ERANGE, "%s: token id %d is not in the vocabulary", tok->name, id);
    const td__idinfo_t *ii = &tok->ids[id];
    int rc;
    if (ii->added >= 0) {
        const td__added_t *at = &tok->added[ii->added];
        if (at->special && st->skip_special)
            return 0;
        /* an added token ends the byte-level chunk: HF decodes each chunk on its own */
        if ((rc = td_detok_finish(tok, st, out)))
            return rc;
        return td_buf_append(out, tok->arena + at->off, at->len);
    }
    return emit_bytes(st, (const uint8_t *)tok->arena + ii->dec_off, ii->dec_len, out);
}

int td_tokenizer_token_bytes(const td_tokenizer_t *tok, int32_t id, td_buf_t *out)
{
    if (id < 0 || (size_t)id >= tok->nids ||
        (tok->ids[id].tok_len == UINT32_MAX && tok->ids[id].added < 0))
        return td_err_set(TD_ERANGE, "%s: token id %d is not in the vocabulary", tok->name, id);
    const td__idinfo_t *ii = &tok->ids[id];
    if (ii->added >= 0) {
        const td__added_t *at = &tok->added[ii->added];
        return td_buf_append(out, tok->arena + at->off, at->len);
    }
    return td_buf_append(out, tok->arena + ii->dec_off, ii->dec_len);
}

int td_tokenizer_decode(const td_tokenizer_t *tok, const int32_t *ids, size_t n,
                        bool skip_special_tokens, td_buf_t *out)
{
    td_detok_t st;
    td_detok_init(&st, skip_special_tokens);
    if (td_buf_reserve(out, n * 4 + 1))
        return TD_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int rc = td_detok_step(tok, &st, ids[i], out);
        if (rc == TD_ERANGE)
            return td_err_set(TD_ERANGE, "%s: token id %d (at index %zu) is not in the vocabulary",
                              tok->name, ids[i], i);
        if (rc)
            return rc;
    }
    return td_detok_finish(tok, &st, out);
}
