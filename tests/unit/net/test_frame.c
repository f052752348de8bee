/* test_frame.c: control-plane framing (reassembly, limits, malformed payloads, one-pass packing)
 * and HMAC auth. */
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

/* ---- one-pass packing (pbpack.c) against protobuf-c ---------------------------------------- */

typedef struct gen {
    uint64_t x;
    void *mem[4096];
    size_t n_mem;
} gen_t;

static uint64_t gen_next(gen_t *g)
{
    g->x ^= g->x << 13;
    g->x ^= g->x >> 7;
    g->x ^= g->x << 17;
    return g->x;
}

static void *gen_alloc(gen_t *g, size_t n)
{
    ck_assert_uint_lt(g->n_mem, sizeof(g->mem) / sizeof(*g->mem));
    void *p = calloc(1, n ? n : 1);
    ck_assert_ptr_nonnull(p);
    return g->mem[g->n_mem++] = p;
}

static void gen_message(gen_t *g, const ProtobufCMessageDescriptor *d, ProtobufCMessage *m,
                        int depth);

/* A random value of field `f` at `v`: zero, edge or arbitrary, as the packers must each treat. */
static void gen_value(gen_t *g, const ProtobufCFieldDescriptor *f, void *v, int depth)
{
    uint64_t r = gen_next(g);
    int kind = (int)(r % 5);
    if (depth < 0) { /* an array element: protobuf-c's sizing takes no NULL string or message */
        depth = -1 - depth;
        kind += kind == 0 && (f->type == PROTOBUF_C_TYPE_STRING ||
                              f->type == PROTOBUF_C_TYPE_MESSAGE);
    } /* 0: zero, 1: small, 2: big, 3: negative, 4: arbitrary */
    uint64_t big = gen_next(g);
    uint64_t val = kind == 0 ? 0 : kind == 1 ? r >> 58 : kind == 2 ? big | 1ull << 63 : big;
    switch (f->type) {
    case PROTOBUF_C_TYPE_BOOL:
        *(protobuf_c_boolean *)v = kind ? 1 : 0;
        break;
    case PROTOBUF_C_TYPE_ENUM:
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        *(int32_t *)v = kind == 3 ? -(int32_t)(r >> 40 & 0xffff) - 1 : (int32_t)val;
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        *(uint32_t *)v = (uint32_t)(val >> (kind == 2 ? 32 : 0));
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        *(int64_t *)v = kind == 3 ? -(int64_t)(r >> 20) - 1 : (int64_t)val;
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        *(uint64_t *)v = val;
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        *(float *)v = kind == 0 ? 0.0f : kind == 3 ? -0.0f : (float)(int64_t)val / 7.0f;
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        *(double *)v = kind == 0 ? 0.0 : kind == 3 ? -0.0 : (double)(int64_t)val / 3.0;
        break;
    case PROTOBUF_C_TYPE_STRING: {
        if (kind == 0) {
            *(char **)v = NULL;
            break;
        }
        size_t n = kind == 1 ? 0 : kind == 2 ? 130 + r % 200 : r % 20;
        char *s = gen_alloc(g, n + 1);
        for (size_t i = 0; i < n; i++)
            s[i] = (char)('a' + (gen_next(g) % 26));
        *(char **)v = s;
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData *b = v;
        b->len = kind == 0 ? 0 : kind == 2 ? 200 + r % 300 : r % 24;
        b->data = b->len || kind == 1 ? gen_alloc(g, b->len) : NULL;
        for (size_t i = 0; i < b->len; i++)
            b->data[i] = (uint8_t)gen_next(g);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        if (kind == 0) {
            *(ProtobufCMessage **)v = NULL;
            break;
        }
        const ProtobufCMessageDescriptor *sd = f->descriptor;
        ProtobufCMessage *sub = gen_alloc(g, sd->sizeof_message);
        if (depth >= 4) /* deep enough: an empty message */
            protobuf_c_message_init(sd, sub);
        else
            gen_message(g, sd, sub, depth + 1);
        *(ProtobufCMessage **)v = sub;
        break;
    }
    }
}

static size_t gen_elem_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    default:
        return 4;
    }
}

static void gen_message(gen_t *g, const ProtobufCMessageDescriptor *d, ProtobufCMessage *m,
                        int depth)
{
    protobuf_c_message_init(d, m);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        char *v = (char *)m + f->offset, *q = (char *)m + f->quantifier_offset;
        uint64_t r = gen_next(g);
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = r % 4 == 0 ? 0 : r % 4 == 1 ? 1 + r % 5 : r % 4 == 2 ? 40 + r % 60 : 3;
            if (f->type == PROTOBUF_C_TYPE_MESSAGE && n > 3)
                n = depth ? 1 : 3 + r % 8;
            size_t es = gen_elem_size(f->type);
            char *a = n ? gen_alloc(g, n * es) : NULL;
            for (size_t k = 0; k < n; k++)
                gen_value(g, f, a + k * es, -1 - depth); /* no NULL elements */
            *(size_t *)(void *)q = n;
            *(void **)(void *)v = a;
        } else if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            if (r % 3 == 0) { /* this member chosen; a later one may take the oneof over */
                *(uint32_t *)(void *)q = f->id;
                gen_value(g, f, v, depth);
            }
        } else {
            gen_value(g, f, v, depth);
            if (f->label == PROTOBUF_C_LABEL_OPTIONAL)
                *(protobuf_c_boolean *)(void *)q = (r >> 8) % 2;
        }
    }
    if (gen_next(g) % 8 == 0) { /* unknown fields, as unpacking newer peers' frames keeps */
        size_t n = 1 + gen_next(g) % 2;
        ProtobufCMessageUnknownField *u = gen_alloc(g, n * sizeof(*u));
        for (size_t k = 0; k < n; k++) {
            u[k].tag = 1000 + (uint32_t)(gen_next(g) % 100000);
            u[k].wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
            u[k].len = 1 + gen_next(g) % 9;
            u[k].data = gen_alloc(g, u[k].len);
            u[k].data[0] = (uint8_t)(u[k].len - 1);
        }
        m->n_unknown_fields = (unsigned)n;
        m->unknown_fields = u;
    }
}

/* `m` through td_frame_encode_max: the header and exactly protobuf-c's bytes; one byte under
 * the limit fails and leaves the buffer as it was. */
static void check_pack_same(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *want = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(want);
    ck_assert_uint_eq(protobuf_c_message_pack(m, want), n);
    td_buf_t b;
    td_buf_init(&b);
    td_buf_append(&b, "xy", 2);
    ck_assert_int_eq(td_frame_encode_max(m, &b, n), 0);
    ck_assert_uint_eq(b.len, 2 + TD_FRAME_HEADER + n);
    const uint8_t *h = (const uint8_t *)b.data + 2;
    ck_assert_uint_eq((size_t)h[0] << 24 | (size_t)h[1] << 16 | (size_t)h[2] << 8 | h[3], n);
    ck_assert_mem_eq(h + TD_FRAME_HEADER, want, n);
    if (n) {
        ck_assert_int_eq(td_frame_encode_max(m, &b, n - 1), TD_EOVERFLOW);
        ck_assert_uint_eq(b.len, 2 + TD_FRAME_HEADER + n);
    }
    td_buf_free(&b);
    free(want);
}

/* Random frames of every body (and KvNote, which rides on UCX pushes): zero and negative
 * values, -0.0, NULL and empty strings, oneofs, has_ flags, arrays past the one-byte length,
 * sub-messages past 2 KiB (the stack buffer's growth), unknown fields. */
START_TEST(test_frame_pack_one_pass)
{
    gen_t g = {.x = 0x9E3779B97F4A7C15ull};
    const ProtobufCMessageDescriptor *descs[] = {&tandem__frame__descriptor,
                                                 &tandem__kv_note__descriptor};
    size_t big = 0;
    for (int it = 0; it < 3000; it++) {
        const ProtobufCMessageDescriptor *d = descs[it % 2 ? 0 : (it / 2) % 2];
        ProtobufCMessage *m = gen_alloc(&g, d->sizeof_message);
        gen_message(&g, d, m, 0);
        check_pack_same(m);
        big += protobuf_c_message_get_packed_size(m) > 2048;
        for (size_t k = 0; k < g.n_mem; k++)
            free(g.mem[k]);
        g.n_mem = 0;
    }
    ck_assert_uint_gt(big, 10);
    /* the hand-built frames the daemons send most */
    td_buf_t b;
    td_buf_init(&b);
    int32_t toks[300];
    for (int i = 0; i < 300; i++)
        toks[i] = i * 977 - 50;
    Tandem__Sampling sp = TANDEM__SAMPLING__INIT;
    sp.temperature = 0.7f;
    sp.max_tokens = 4;
    sp.logprobs = -1;
    Tandem__DecodeTask dt = TANDEM__DECODE_TASK__INIT;
    dt.request_id = 77;
    dt.n_tokens = 300;
    dt.tokens = toks;
    dt.sampling = &sp;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_DECODE_TASK;
    f.decode_task = &dt;
    check_pack_same(&f.base);
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
    tcase_add_test(tc, test_frame_pack_one_pass);
    tcase_add_test(tc, test_hmac);
    suite_add_tcase(s, tc);
    return td_check_run(s);
}
