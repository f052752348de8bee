/* frame.c: length-prefixed protobuf frames, HMAC-SHA256, random bytes (OpenSSL). */
#include "td_frame.h"
#include "td_error.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define ARENA_POISON(p, n) ((void)(p), (void)(n))
#define ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define ARENA_ALIGN alignof(max_align_t)
#define ARENA_FIRST 4096u         /* bytes of the first block */
#define ARENA_KEEP_MAX (64u << 10) /* the block grows no larger: bigger frames malloc their parts */

void td_frame_reader_init(td_frame_reader_t *r, size_t max_frame)
{
    td_buf_init(&r->buf);
    r->off = 0;
    r->max_frame = max_frame ? max_frame : TD_FRAME_DEFAULT_MAX;
}

void td_frame_reader_free(td_frame_reader_t *r)
{
    td_buf_free(&r->buf);
    r->off = 0;
}

static uint32_t peek_len(const td_frame_reader_t *r)
{
    const uint8_t *p = (const uint8_t *)r->buf.data + r->off;
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

int td_frame_reader_feed(td_frame_reader_t *r, const void *data, size_t len)
{
    /* Drop consumed bytes before growing, so the buffer holds at most one partial frame plus
     * whatever arrived with it. */
    if (r->off && r->off == r->buf.len) {
        td_buf_reset(&r->buf);
        r->off = 0;
    } else if (r->off > r->buf.len / 2) {
        memmove(r->buf.data, r->buf.data + r->off, r->buf.len - r->off);
        r->buf.len -= r->off;
        r->off = 0;
    }
    int rc = td_buf_append(&r->buf, data, len);
    if (rc)
        return rc;
    if (r->buf.len - r->off >= TD_FRAME_HEADER && peek_len(r) > r->max_frame)
        return td_err_set(TD_EPROTO, "frame of %u bytes exceeds the limit of %zu", peek_len(r),
                          r->max_frame);
    return 0;
}

int td_frame_reader_next(td_frame_reader_t *r, const uint8_t **payload, size_t *len)
{
    size_t avail = r->buf.len - r->off;
    if (avail < TD_FRAME_HEADER)
        return 0;
    uint32_t n = peek_len(r);
    if (n > r->max_frame)
        return td_err_set(TD_EPROTO, "frame of %u bytes exceeds the limit of %zu", n,
                          r->max_frame);
    if (avail - TD_FRAME_HEADER < n)
        return 0;
    *payload = (const uint8_t *)r->buf.data + r->off + TD_FRAME_HEADER;
    *len = n;
    r->off += TD_FRAME_HEADER + n;
    return 1;
}

typedef union arena_big {
    union arena_big *next;
    max_align_t align; /* the bytes after the header keep malloc's alignment */
} arena_big_t;

static void *arena_alloc(void *ud, size_t n)
{
    td_frame_arena_t *a = ud;
    size_t sz = (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (!sz)
        sz = ARENA_ALIGN; /* never the block's own address when it has none */
    if (sz < n)
        return NULL;
    a->need += sz;
    if (sz <= a->cap - a->used) {
        void *p = a->block + a->used;
        a->used += sz;
        ARENA_UNPOISON(p, n);
        return p;
    }
    if (sz > SIZE_MAX - sizeof(arena_big_t))
        return NULL;
    arena_big_t *b = malloc(sizeof(*b) + sz);
    if (!b)
        return NULL;
    b->next = a->big;
    a->big = b;
    return b + 1;
}

static void arena_nofree(void *ud, void *p)
{
    (void)ud;
    (void)p;
}

void td_frame_arena_init(td_frame_arena_t *a)
{
    memset(a, 0, sizeof(*a));
    a->pa.alloc = arena_alloc;
    a->pa.free = arena_nofree;
    a->pa.allocator_data = a;
}

ProtobufCAllocator *td_frame_arena_allocator(td_frame_arena_t *a)
{
    return &a->pa;
}

void td_frame_arena_reset(td_frame_arena_t *a)
{
    for (arena_big_t *b = a->big, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    a->big = NULL;
    /* more needed than the block holds: parts spilled, so the block grows to the frame */
    size_t want = a->need > ARENA_KEEP_MAX ? ARENA_KEEP_MAX : a->need;
    if (want > a->cap) {
        size_t cap = a->cap ? a->cap : ARENA_FIRST;
        while (cap < want)
            cap *= 2;
        uint8_t *nb = malloc(cap);
        if (nb) { /* without it the old block stays and parts keep spilling */
            if (a->block)
                ARENA_UNPOISON(a->block, a->cap);
            free(a->block);
            a->block = nb;
            a->cap = cap;
        }
    }
    if (a->block)
        ARENA_POISON(a->block, a->cap);
    a->used = 0;
    a->need = 0;
}

void td_frame_arena_free(td_frame_arena_t *a)
{
    a->need = 0; /* the reset frees the spills and grows nothing */
    td_frame_arena_reset(a);
    if (a->block)
        ARENA_UNPOISON(a->block, a->cap);
    free(a->block);
    a->block = NULL;
    a->cap = 0;
}

int td_auth_mac(const void *key, size_t key_len, const void *const *parts, const size_t *lens,
                size_t n_parts, uint8_t out[32])
{
    int rc = TD_EINTERNAL;
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
    if (!ctx)
        goto out;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string("digest", "SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    if (!EVP_MAC_init(ctx, key, key_len, params))
        goto out;
    for (size_t i = 0; i < n_parts; i++)
        if (!EVP_MAC_update(ctx, parts[i], lens[i]))
            goto out;
    size_t outl = 0;
    if (!EVP_MAC_final(ctx, out, &outl, 32) || outl != 32)
        goto out;
    rc = 0;
out:
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
    return rc ? td_err_set(rc, "HMAC-SHA256 failed in OpenSSL") : 0;
}

int td_sha256(const void *p, size_t n, uint8_t out[32])
{
    unsigned int outl = 0;
    if (!EVP_Digest(p, n, out, &outl, EVP_sha256(), NULL) || outl != 32)
        return td_err_set(TD_EINTERNAL, "SHA-256 failed in OpenSSL");
    return 0;
}

bool td_auth_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
    return CRYPTO_memcmp(a, b, n) == 0;
}

int td_random_bytes(void *out, size_t n)
{
    if (n > INT32_MAX || RAND_bytes(out, (int)n) != 1)
        return td_err_set(TD_EINTERNAL, "no random bytes from OpenSSL");
    return 0;
}

/* OpenSSL's RAND_bytes checks for a fork (getpid) on every call: ids take their bytes from a
 * per-thread block of its output instead, one call per ID_POOL bytes. */
enum { ID_POOL = 4096 };
static _Thread_local uint8_t id_pool[ID_POOL];
static _Thread_local size_t id_left;

int td_random_id_bytes(void *out, size_t n)
{
    if (n > ID_POOL / 8)
        return td_random_bytes(out, n);
    if (id_left < n) {
        if (RAND_bytes(id_pool, ID_POOL) != 1)
            return td_err_set(TD_EINTERNAL, "no random bytes from OpenSSL");
        id_left = ID_POOL;
    }
    uint8_t *p = id_pool + ID_POOL - id_left;
    memcpy(out, p, n);
    memset(p, 0, n); /* a byte handed out is not kept */
    id_left -= n;
    return 0;
}
