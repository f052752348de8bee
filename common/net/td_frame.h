/* td_frame.h: control-plane framing and authentication primitives.
 *
 * On the wire every control-plane and RPC message is a 4-byte big-endian length followed by that
 * many bytes of one serialized protobuf message (a tandem.Frame). The reader below reassembles
 * frames from arbitrary stream chunks (libuv read callbacks hand over whatever arrived) and
 * rejects a frame longer than its limit before buffering it, so a peer cannot make a daemon
 * allocate without bound.
 *
 * Authentication is an HMAC-SHA256 challenge over the shared cluster secret; td_auth_mac computes
 * the MAC over a list of byte strings and td_auth_equal compares MACs in constant time.
 */
#ifndef TD_FRAME_H
#define TD_FRAME_H

#include "td_util.h"

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TD_FRAME_HEADER 4u
#define TD_FRAME_DEFAULT_MAX (64u << 20) /* bytes of payload */

/* Append one frame (header + packed message) to `out`: protobuf-c's bytes, written in one pass
 * (pbpack.c). 0, TD_ENOMEM, or TD_EOVERFLOW when the message is over `max` bytes (`out` is then
 * unchanged); td_frame_encode's limit is the header's, 4 GiB - 1. */
int td_frame_encode_max(const ProtobufCMessage *msg, td_buf_t *out, size_t max);
int td_frame_encode(const ProtobufCMessage *msg, td_buf_t *out);

/* Incremental frame reader. Owns its buffer; td_frame_reader_free releases it. */
typedef struct td_frame_reader {
    td_buf_t buf;     /* bytes received and not yet consumed */
    size_t off;       /* start of the first unconsumed byte in buf */
    size_t max_frame; /* largest payload accepted, bytes */
} td_frame_reader_t;

void td_frame_reader_init(td_frame_reader_t *r, size_t max_frame);
void td_frame_reader_free(td_frame_reader_t *r);

/* Append received bytes. 0, TD_ENOMEM, or TD_EPROTO when a header announces a payload above the
 * limit (the stream is then unusable: close the connection). */
int td_frame_reader_feed(td_frame_reader_t *r, const void *data, size_t len);

/* Take the next complete frame: 1 with *payload and *len pointing into the reader's buffer (valid
 * until the next feed or next call), 0 when more bytes are needed. */
int td_frame_reader_next(td_frame_reader_t *r, const uint8_t **payload, size_t *len);

/* Bump allocator for unpacking received frames: every part of a message unpacked through
 * td_frame_arena_allocator comes out of one block, and td_frame_arena_reset drops them all at once
 * (no malloc or free per field, no protobuf_c_message_free_unpacked walk). A part that does not
 * fit gets its own malloc, freed at the reset; the block then grows to what that frame needed (up
 * to a cap), so steady traffic stays in the block. A message unpacked here is valid until the next
 * reset: copy what must outlive it. */
typedef struct td_frame_arena {
    ProtobufCAllocator pa;
    uint8_t *block;
    size_t cap, used;
    void *big;   /* allocations that did not fit the block: a list freed at the reset */
    size_t need; /* bytes asked for since the last reset */
} td_frame_arena_t;

void td_frame_arena_init(td_frame_arena_t *a);
void td_frame_arena_free(td_frame_arena_t *a);
/* The allocator to pass to a protobuf-c unpack; its free does nothing. */
ProtobufCAllocator *td_frame_arena_allocator(td_frame_arena_t *a);
/* Drop everything allocated since the last reset. */
void td_frame_arena_reset(td_frame_arena_t *a);

/* HMAC-SHA256(key, parts[0] || parts[1] || ...) into out[32]. 0 or TD_EINTERNAL. */
int td_auth_mac(const void *key, size_t key_len, const void *const *parts, const size_t *lens,
                size_t n_parts, uint8_t out[32]);

/* SHA-256 of [p, p+n) into out[32] (API key hashes). 0 or TD_EINTERNAL. */
int td_sha256(const void *p, size_t n, uint8_t out[32]);

/* Constant-time comparison of two byte strings of length n. */
bool td_auth_equal(const uint8_t *a, const uint8_t *b, size_t n);

/* Fill `out` with cryptographically random bytes. 0 or TD_EINTERNAL. */
int td_random_bytes(void *out, size_t n);
/* Random bytes for identifiers (response and tool-call ids): the same CSPRNG output, drawn from
 * a per-thread block so that most calls make no system call. Not for keys or nonces, and not
 * across fork (a child would repeat its parent's block). 0 or TD_EINTERNAL. */
int td_random_id_bytes(void *out, size_t n);

#endif
