/* pbpack.c: protobuf-c messages serialised in one pass, back to front.
 *
 * protobuf-c packs in two walks of the message: protobuf_c_message_get_packed_size, so the
 * caller can size the buffer, then protobuf_c_message_pack. Writing the message backwards needs
 * no sizes first: the last field is written at the end of the buffer, each earlier one in front
 * of it, and a length-delimited part (a sub-message, a packed array) gets its length prefix once
 * its contents are down, when the length is known. One walk over the descriptors instead of two.
 *
 * The bytes are protobuf-c's own: the fields in descriptor order, the same presence rules
 * (oneof case, has_ flags, proto3 zero values left out), the same varint forms (negative int32 as
 * ten bytes), unknown fields last. tests/unit/net/test_frame.c and fuzz_frame compare the two
 * byte for byte. */
#include "td_error.h"
#include "td_frame.h"

#include <stdlib.h>
#include <string.h>

#define STACK_BYTES 2048u

typedef struct pbw {
    uint8_t *lo, *p, *hi; /* the message is [p, hi); free room is [lo, p) */
    uint8_t *heap;        /* lo when it came from malloc */
} pbw_t;

static bool grow(pbw_t *w, size_t need)
{
    size_t used = (size_t)(w->hi - w->p), cap = (size_t)(w->hi - w->lo);
    size_t ncap = cap * 2;
    if (ncap < used + need + 256)
        ncap = used + need + 256;
    uint8_t *b = malloc(ncap);
    if (!b)
        return false;
    memcpy(b + ncap - used, w->p, used);
    free(w->heap);
    w->heap = w->lo = b;
    w->hi = b + ncap;
    w->p = w->hi - used;
    return true;
}

static inline bool room(pbw_t *w, size_t n)
{
    return (size_t)(w->p - w->lo) >= n || grow(w, n);
}

static inline size_t used(const pbw_t *w)
{
    return (size_t)(w->hi - w->p);
}

/* Varints: the caller has made room for 10 bytes. */
static inline void put_varint(pbw_t *w, uint64_t v)
{
    unsigned bits = 64u - (unsigned)__builtin_clzll(v | 1);
    unsigned n = (bits + 6) / 7;
    uint8_t *q = w->p -= n;
    for (unsigned i = 0; i + 1 < n; i++, v >>= 7)
        q[i] = (uint8_t)(v | 0x80);
    q[n - 1] = (uint8_t)v;
}

/* A non-negative int32 (token ids): up to three bytes without a loop; the caller has made room
 * for 10 bytes. */
static inline void put_varint_i32(pbw_t *w, int32_t x)
{
    uint32_t v = (uint32_t)x;
    if (v < 1u << 7) {
        *--w->p = (uint8_t)v;
    } else if (v < 1u << 14) {
        uint8_t *q = w->p -= 2;
        q[0] = (uint8_t)(v | 0x80);
        q[1] = (uint8_t)(v >> 7);
    } else if (v < 1u << 21) {
        uint8_t *q = w->p -= 3;
        q[0] = (uint8_t)(v | 0x80);
        q[1] = (uint8_t)(v >> 7 | 0x80);
        q[2] = (uint8_t)(v >> 14);
    } else {
        put_varint(w, (uint64_t)(int64_t)x);
    }
}

static inline void put_bytes(pbw_t *w, const void *b, size_t n)
{
    w->p -= n;
    if (n)
        memcpy(w->p, b, n);
}

static inline uint32_t zz32(int32_t v)
{
    return ((uint32_t)v << 1) ^ (uint32_t)(v >> 31);
}

static inline uint64_t zz64(int64_t v)
{
    return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
}

static inline bool put_tag(pbw_t *w, uint32_t id, unsigned wire)
{
    if (!room(w, 10))
        return false;
    put_varint(w, (uint64_t)id << 3 | wire);
    return true;
}

static bool put_message(pbw_t *w, const ProtobufCMessage *m);

/* One value of field `f` at `v`, without its tag; false when out of memory. */
static bool put_value(pbw_t *w, const ProtobufCFieldDescriptor *f, const void *v)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_SINT32:
        if (!room(w, 10))
            return false;
        put_varint(w, zz32(*(const int32_t *)v));
        return true;
    case PROTOBUF_C_TYPE_ENUM:
    case PROTOBUF_C_TYPE_INT32: /* negative: the sign-extended 64-bit form, as protobuf-c */
        if (!room(w, 10))
            return false;
        put_varint(w, (uint64_t)(int64_t) * (const int32_t *)v);
        return true;
    case PROTOBUF_C_TYPE_UINT32:
        if (!room(w, 10))
            return false;
        put_varint(w, *(const uint32_t *)v);
        return true;
    case PROTOBUF_C_TYPE_SINT64:
        if (!room(w, 10))
            return false;
        put_varint(w, zz64(*(const int64_t *)v));
        return true;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_UINT64:
        if (!room(w, 10))
            return false;
        put_varint(w, *(const uint64_t *)v);
        return true;
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        if (!room(w, 4))
            return false;
        put_bytes(w, v, 4); /* little-endian hosts only, as the rest of the wire code */
        return true;
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        if (!room(w, 8))
            return false;
        put_bytes(w, v, 8);
        return true;
    case PROTOBUF_C_TYPE_BOOL:
        if (!room(w, 1))
            return false;
        *--w->p = *(const protobuf_c_boolean *)v ? 1 : 0;
        return true;
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)v;
        size_t n = s ? strlen(s) : 0;
        if (!room(w, n + 10))
            return false;
        put_bytes(w, s, n);
        put_varint(w, n);
        return true;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = v;
        if (!room(w, b->len + 10))
            return false;
        put_bytes(w, b->data, b->len);
        put_varint(w, b->len);
        return true;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)v;
        size_t end = used(w);
        if (sub && !put_message(w, sub))
            return false;
        if (!room(w, 10))
            return false;
        put_varint(w, used(w) - end);
        return true;
    }
    }
    return true;
}

static unsigned wire_of(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
        return PROTOBUF_C_WIRE_TYPE_32BIT;
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return PROTOBUF_C_WIRE_TYPE_64BIT;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_BYTES:
    case PROTOBUF_C_TYPE_MESSAGE:
        return PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
    default:
        return PROTOBUF_C_WIRE_TYPE_VARINT;
    }
}

static size_t elem_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_UINT64:
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

/* protobuf-c's rule for leaving out a proto3 field without presence. */
static bool zeroish(const ProtobufCFieldDescriptor *f, const void *v)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_BOOL:
        return *(const protobuf_c_boolean *)v == 0;
    case PROTOBUF_C_TYPE_ENUM:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FIXED32:
        return *(const uint32_t *)v == 0;
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
        return *(const uint64_t *)v == 0;
    case PROTOBUF_C_TYPE_FLOAT:
        return *(const float *)v == 0; /* -0.0 too */
    case PROTOBUF_C_TYPE_DOUBLE:
        return *(const double *)v == 0;
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(const char *const *)v;
        return !s || !*s;
    }
    case PROTOBUF_C_TYPE_BYTES:
        return ((const ProtobufCBinaryData *)v)->len == 0;
    case PROTOBUF_C_TYPE_MESSAGE:
        return *(const void *const *)v == NULL;
    }
    return true;
}

static bool put_repeated(pbw_t *w, const ProtobufCFieldDescriptor *f, size_t count, const void *arr)
{
    if (!count)
        return true;
    size_t es = elem_size(f->type);
    const char *a = *(const char *const *)arr;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_PACKED) {
        size_t end = used(w);
        if (f->type == PROTOBUF_C_TYPE_INT32 || f->type == PROTOBUF_C_TYPE_ENUM) {
            /* the common case (token ids) without the per-value dispatch */
            const int32_t *x = (const int32_t *)(const void *)a;
            if (!room(w, count * 10))
                return false;
            for (size_t i = count; i-- > 0;)
                put_varint_i32(w, x[i]);
        } else if (wire_of(f->type) != PROTOBUF_C_WIRE_TYPE_VARINT) {
            if (!room(w, count * es))
                return false;
            put_bytes(w, a, count * es);
        } else {
            for (size_t i = count; i-- > 0;)
                if (!put_value(w, f, a + i * es))
                    return false;
        }
        if (!room(w, 10))
            return false;
        put_varint(w, used(w) - end);
        return put_tag(w, f->id, PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED);
    }
    unsigned wire = wire_of(f->type);
    for (size_t i = count; i-- > 0;)
        if (!put_value(w, f, a + i * es) || !put_tag(w, f->id, wire))
            return false;
    return true;
}

static bool put_message(pbw_t *w, const ProtobufCMessage *m)
{
    for (size_t i = m->n_unknown_fields; i-- > 0;) {
        const ProtobufCMessageUnknownField *u = &m->unknown_fields[i];
        if (!room(w, u->len + 10))
            return false;
        put_bytes(w, u->data, u->len);
        put_varint(w, (uint64_t)u->tag << 3 | u->wire_type);
    }
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = d->n_fields; i-- > 0;) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *v = (const char *)m + f->offset;
        const char *q = (const char *)m + f->quantifier_offset;
        bool ptr = f->type == PROTOBUF_C_TYPE_MESSAGE || f->type == PROTOBUF_C_TYPE_STRING;
        switch (f->label) {
        case PROTOBUF_C_LABEL_REQUIRED:
            break;
        case PROTOBUF_C_LABEL_REPEATED:
            if (!put_repeated(w, f, *(const size_t *)(const void *)q, v))
                return false;
            continue;
        case PROTOBUF_C_LABEL_OPTIONAL:
        case PROTOBUF_C_LABEL_NONE:
            if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                if (*(const uint32_t *)(const void *)q != f->id)
                    continue;
                if (ptr && (!*(const void *const *)(const void *)v ||
                            *(const void *const *)(const void *)v == f->default_value))
                    continue;
            } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL) {
                if (ptr ? !*(const void *const *)(const void *)v ||
                              *(const void *const *)(const void *)v == f->default_value
                        : !*(const protobuf_c_boolean *)(const void *)q)
                    continue;
            } else if (zeroish(f, v)) {
                continue;
            }
            break;
        }
        if (!put_value(w, f, v) || !put_tag(w, f->id, wire_of(f->type)))
            return false;
    }
    return true;
}

int td_frame_encode_max(const ProtobufCMessage *msg, td_buf_t *out, size_t max)
{
    uint8_t stack[STACK_BYTES];
    pbw_t w = {.lo = stack, .p = stack + sizeof(stack), .hi = stack + sizeof(stack)};
    int rc = 0;
    if (!put_message(&w, msg)) {
        rc = TD_ENOMEM;
        goto out;
    }
    size_t n = used(&w);
    if (n > max || n > UINT32_MAX) {
        rc = td_err_set(TD_EOVERFLOW, "frame of %zu bytes exceeds the limit", n);
        goto out;
    }
    if ((rc = td_buf_reserve(out, TD_FRAME_HEADER + n)))
        goto out;
    uint8_t *p = (uint8_t *)out->data + out->len;
    p[0] = (uint8_t)(n >> 24);
    p[1] = (uint8_t)(n >> 16);
    p[2] = (uint8_t)(n >> 8);
    p[3] = (uint8_t)n;
    memcpy(p + TD_FRAME_HEADER, w.p, n);
    out->len += TD_FRAME_HEADER + n;
    out->data[out->len] = '\0';
out:
    free(w.heap);
    return rc;
}

int td_frame_encode(const ProtobufCMessage *msg, td_buf_t *out)
{
    return td_frame_encode_max(msg, out, UINT32_MAX);
}
