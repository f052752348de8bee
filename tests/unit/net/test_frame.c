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
    tcase_add_test(tc, test_hmac);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}
