/* test_frame.c: control-plane framing (reassembly, limits, malformed payloads) and HMAC auth. */
#include "control.pb-c.h"
#include "td_error.h"
#include "td_frame.h"
#include "td_check.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

static void encode_heartbeat(td_buf_t *out, uint64_t seq, uint32_t free_blocks)
{
    Tandem__Load load = TANDEM__LOAD__INIT;
    load.free_blocks = free_blocks;
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    hb.seq = seq;
    hb.load = &load;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_HEARTBEAT;
    f.heartbeat = &hb;
    ck_assert_int_eq(td_frame_encode(&f.base, out), 0);
}

/* Feed `stream` to a reader in chunks of `chunk` bytes and decode every frame. */
static size_t decode_all(const td_buf_t *stream, size_t chunk, uint64_t *seqs, size_t max)
{
    td_frame_reader_t r;
    td_frame_reader_init(&r, 1024);
    size_t n = 0;
    for (size_t off = 0; off < stream->len; off += chunk) {
        size_t len = stream->len - off < chunk ? stream->len - off : chunk;
        ck_assert_int_eq(td_frame_reader_feed(&r, stream->data + off, len), 0);
        const uint8_t *p;
        size_t plen;
        int rc;
        while ((rc = td_frame_reader_next(&r, &p, &plen)) == 1) {
            Tandem__Frame *f = tandem__frame__unpack(NULL, plen, p);
            ck_assert_ptr_nonnull(f);
            ck_assert_int_eq(f->body_case, TANDEM__FRAME__BODY_HEARTBEAT);
            ck_assert_uint_lt(n, max);
            seqs[n++] = f->heartbeat->seq;
            ck_assert_uint_eq(f->heartbeat->load->free_blocks, f->heartbeat->seq * 3);
            tandem__frame__free_unpacked(f, NULL);
        }
        ck_assert_int_eq(rc, 0);
    }
    td_frame_reader_free(&r);
    return n;
}

START_TEST(test_frames_any_chunking)
{
    td_buf_t s;
    td_buf_init(&s);
    for (uint64_t i = 0; i < 50; i++)
        encode_heartbeat(&s, i * 1000003u, (uint32_t)(i * 1000003u * 3));
    static const size_t chunks[] = {1, 2, 3, 5, 7, 64, 4096};
    for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
        uint64_t seqs[64];
        ck_assert_uint_eq(decode_all(&s, chunks[c], seqs, 64), 50);
        for (uint64_t i = 0; i < 50; i++)
            ck_assert_uint_eq(seqs[i], i * 1000003u);
    }
    td_buf_free(&s);
}
END_TEST

START_TEST(test_frame_limit)
{
    td_frame_reader_t r;
    td_frame_reader_init(&r, 16);
    const uint8_t hdr[4] = {0, 0, 0, 17};
    ck_assert_int_eq(td_frame_reader_feed(&r, hdr, 2), 0);
    ck_assert_int_eq(td_frame_reader_feed(&r, hdr + 2, 2), TD_EPROTO);
    ck_assert_ptr_nonnull(strstr(td_err_msg(), "exceeds"));
    const uint8_t *p;
    size_t len;
    ck_assert_int_eq(td_frame_reader_next(&r, &p, &len), TD_EPROTO);
    td_frame_reader_free(&r);
    /* a huge announced length is refused before any payload is buffered */
    td_frame_reader_init(&r, 0);
    const uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
    ck_assert_int_eq(td_frame_reader_feed(&r, huge, 4), TD_EPROTO);
    td_frame_reader_free(&r);
}
END_TEST

START_TEST(test_frame_malformed_payload)
{
    /* a well-framed payload that is not a valid Frame must be rejected by the unpacker */
    const uint8_t junk[] = {0, 0, 0, 5, 0x0a, 0xff, 0xff, 0xff, 0xff};
    td_frame_reader_t r;
    td_frame_reader_init(&r, 0);
    ck_assert_int_eq(td_frame_reader_feed(&r, junk, sizeof(junk)), 0);
    const uint8_t *p;
    size_t len;
    ck_assert_int_eq(td_frame_reader_next(&r, &p, &len), 1);
    ck_assert_uint_eq(len, 5);
    ck_assert_ptr_null(tandem__frame__unpack(NULL, len, p));
    ck_assert_int_eq(td_frame_reader_next(&r, &p, &len), 0);
    /* zero-length frame is a valid, empty Frame */
    const uint8_t empty[] = {0, 0, 0, 0};
    ck_assert_int_eq(td_frame_reader_feed(&r, empty, 4), 0);
    ck_assert_int_eq(td_frame_reader_next(&r, &p, &len), 1);
    ck_assert_uint_eq(len, 0);
    Tandem__Frame *f = tandem__frame__unpack(NULL, len, p);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(f->body_case, TANDEM__FRAME__BODY__NOT_SET);
    tandem__frame__free_unpacked(f, NULL);
    td_frame_reader_free(&r);
}
END_TEST

/* Pack a GenerateRequest of n tokens (ids i * 7) and a prompt string into `out` (reset first). */
static void pack_generate(td_buf_t *out, size_t n, const char *prompt)
{
    int32_t *ids = calloc(n ? n : 1, sizeof(*ids));
    ck_assert_ptr_nonnull(ids);
    for (size_t i = 0; i < n; i++)
        ids[i] = (int32_t)(i * 7);
    Tandem__Sampling sp = TANDEM__SAMPLING__INIT;
    sp.max_tokens = 9;
    char *stops[] = {"\n\n", "END"};
    Tandem__GenerateRequest g = TANDEM__GENERATE_REQUEST__INIT;
    g.request_id = 77;
    g.n_tokens = n;
    g.tokens = ids;
    g.prompt = (char *)prompt;
    g.sampling = &sp;
    g.n_stop = 2;
    g.stop = stops;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_GENERATE;
    f.generate = &g;
    td_buf_reset(out);
    ck_assert_int_eq(td_frame_encode(&f.base, out), 0);
    free(ids);
}

static void check_generate(const Tandem__Frame *f, size_t n, const char *prompt)
{
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(f->body_case, TANDEM__FRAME__BODY_GENERATE);
    const Tandem__GenerateRequest *g = f->generate;
    ck_assert_uint_eq(g->request_id, 77);
    ck_assert_uint_eq(g->n_tokens, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(g->tokens[i], (int32_t)(i * 7));
    ck_assert_str_eq(g->prompt, prompt);
    ck_assert_ptr_nonnull(g->sampling);
    ck_assert_uint_eq(g->sampling->max_tokens, 9);
    ck_assert_uint_eq(g->n_stop, 2);
    ck_assert_str_eq(g->stop[0], "\n\n");
    ck_assert_str_eq(g->stop[1], "END");
}

/* Frames unpacked through the arena read the same as through malloc; a frame too big for the
 * block spills into mallocs and the block then grows to it, up to the cap; a malformed payload
 * fails cleanly and the arena keeps serving. */
START_TEST(test_frame_arena)
{
    td_frame_arena_t a;
    td_frame_arena_init(&a);
    ProtobufCAllocator *pa = td_frame_arena_allocator(&a);
    td_buf_t b;
    td_buf_init(&b);
    const size_t sizes[] = {3, 3, 2000, 2000, 0, 200000, 200000, 5};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(*sizes); k++) {
        size_t n = sizes[k];
        pack_generate(&b, n, k % 2 ? "odd prompt" : "");
        const uint8_t *p = (const uint8_t *)b.data + TD_FRAME_HEADER;
        size_t len = b.len - TD_FRAME_HEADER;
        Tandem__Frame *f = tandem__frame__unpack(pa, len, p);
        check_generate(f, n, k % 2 ? "odd prompt" : "");
        if (k == 1 || k == 3) /* the second frame of a size fits the block the first one grew */
            ck_assert_ptr_null(a.big);
        if (k == 5 || k == 6) /* 800 KB of ids: above the cap, always spills */
            ck_assert_ptr_nonnull(a.big);
        Tandem__Frame *g = tandem__frame__unpack(NULL, len, p);
        check_generate(g, n, k % 2 ? "odd prompt" : "");
        tandem__frame__free_unpacked(g, NULL);
        td_frame_arena_reset(&a);
        ck_assert_ptr_null(a.big);
        ck_assert_uint_eq(a.used, 0);
        ck_assert_uint_le(a.cap, 64u << 10);
    }
    ck_assert_uint_ge(a.cap, 2000 * 4);
    const uint8_t junk[] = {0x0a, 0xff, 0xff, 0xff, 0xff};
    ck_assert_ptr_null(tandem__frame__unpack(pa, sizeof(junk), junk));
    td_frame_arena_reset(&a);
    pack_generate(&b, 4, "after");
    Tandem__Frame *f = tandem__frame__unpack(pa, b.len - TD_FRAME_HEADER,
                                             (const uint8_t *)b.data + TD_FRAME_HEADER);
    check_generate(f, 4, "after");
    td_frame_arena_free(&a);
    td_buf_free(&b);
}
END_TEST

START_TEST(test_hmac)
{
    /* RFC 4231 test case 2 */
    const char *key = "Jefe";
    const char *a = "what do ya want ", *b = "for nothing?";
    const void *parts[] = {a, b};
    size_t lens[] = {strlen(a), strlen(b)};
    uint8_t mac[32];
    ck_assert_int_eq(td_auth_mac(key, 4, parts, lens, 2, mac), 0);
    char hex[65];
    td_hex_encode(mac, 32, hex);
    ck_assert_str_eq(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    uint8_t other[32];
    ck_assert_int_eq(td_auth_mac("Jeff", 4, parts, lens, 2, other), 0);
    ck_assert(!td_auth_equal(mac, other, 32));
    ck_assert(td_auth_equal(mac, mac, 32));
    uint8_t r1[32], r2[32];
    ck_assert_int_eq(td_random_bytes(r1, 32), 0);
    ck_assert_int_eq(td_random_bytes(r2, 32), 0);
    ck_assert(!td_auth_equal(r1, r2, 32));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("frame");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_frames_any_chunking);
    tcase_add_test(tc, test_frame_limit);
    tcase_add_test(tc, test_frame_malformed_payload);
    tcase_add_test(tc, test_frame_arena);
    tcase_add_test(tc, test_hmac);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}
