/* kvindex.c: open-addressing table (linear probing, tombstones) from block hash to holders. */
#include "kvindex.h"
#include "td_error.h"
#include "td_util.h"

#include <stdlib.h>
#include <string.h>

typedef struct holder {
    uint32_t worker;
    uint8_t tier;
} holder_t;

typedef enum { SLOT_EMPTY = 0, SLOT_FULL, SLOT_DEAD } slot_state_t;

typedef struct slot {
    td_kvhash_t key;
    uint8_t state;     /* slot_state_t */
    uint8_t n;         /* holders in use */
    uint8_t cap;       /* holders allocated */
    holder_t *holders; /* [cap] */
} slot_t;

struct td_kvindex {
    slot_t *slots; /* [cap], cap a power of two */
    size_t cap;
    size_t used;   /* FULL slots */
    size_t dead;   /* tombstones */
};

static uint64_t key_hash(const td_kvhash_t *h)
{
    uint64_t v;
    memcpy(&v, h->b, sizeof(v)); /* the key is already a uniform hash */
    return v;
}

td_kvindex_t *td_kvindex_new(void)
{
    td_kvindex_t *ix = calloc(1, sizeof(*ix));
    if (!ix)
        return NULL;
    ix->cap = 1024;
    ix->slots = calloc(ix->cap, sizeof(slot_t));
    if (!ix->slots) {
        free(ix);
        return NULL;
    }
    return ix;
}

void td_kvindex_free(td_kvindex_t *ix)
{
    if (!ix)
        return;
    for (size_t i = 0; i < ix->cap; i++)
        free(ix->slots[i].holders);
    free(ix->slots);
    free(ix);
}

static slot_t *find(const td_kvindex_t *ix, const td_kvhash_t *h)
{
    size_t mask = ix->cap - 1;
    for (size_t i = key_hash(h) & mask, probes = 0; probes < ix->cap; i = (i + 1) & mask, probes++) {
        slot_t *s = &ix->slots[i];
        if (s->state == SLOT_EMPTY)
            return NULL;
        if (s->state == SLOT_FULL && memcmp(&s->key, h, sizeof(*h)) == 0)
            return s;
    }
    return NULL;
}

static int grow(td_kvindex_t *ix)
{
    size_t cap = ix->used * 2 >= ix->cap ? ix->cap * 2 : ix->cap; /* else: just drop tombstones */
    slot_t *slots = calloc(cap, sizeof(slot_t));
    if (!slots)
        return TD_ENOMEM;
    for (size_t i = 0; i < ix->cap; i++) {
        slot_t *s = &ix->slots[i];
        if (s->state != SLOT_FULL) {
            free(s->holders);
            continue;
        }
        size_t j = key_hash(&s->key) & (cap - 1);
        while (slots[j].state == SLOT_FULL)
            j = (j + 1) & (cap - 1);
        slots[j] = *s;
    }
    free(ix->slots);
    ix->slots = slots;
    ix->cap = cap;
    ix->dead = 0;
    return 0;
}

int td_kvindex_add(td_kvindex_t *ix, const td_kvhash_t *h, uint32_t worker, uint8_t tier)
{
    slot_t *s = find(ix, h);
    if (!s) {
        if ((ix->used + ix->dead + 1) * 4 > ix->cap * 3) { /* keep load under 3/4 */
            int rc = grow(ix);
            if (rc)
                return rc;
        }
        size_t mask = ix->cap - 1, i = key_hash(h) & mask;
        while (ix->slots[i].state == SLOT_FULL)
            i = (i + 1) & mask;
        s = &ix->slots[i];
        if (s->state == SLOT_DEAD)
            ix->dead--;
        s->key = *h;
        s->state = SLOT_FULL;
        s->n = 0;
        ix->used++;
    }
    for (uint8_t k = 0; k < s->n; k++) {
        if (s->holders[k].worker == worker) {
            s->holders[k].tier = tier;
            return 0;
        }
    }
    if (s->n == s->cap) {
        if (s->cap == UINT8_MAX)
            return TD_ENOSPC;
        uint8_t cap = s->cap ? (uint8_t)TD_MIN(2 * s->cap, UINT8_MAX) : 2;
        holder_t *hs = realloc(s->holders, cap * sizeof(holder_t));
        if (!hs)
            return TD_ENOMEM;
        s->holders = hs;
        s->cap = cap;
    }
    s->holders[s->n++] = (holder_t){worker, tier};
    return 0;
}

static void drop_holder(td_kvindex_t *ix, slot_t *s, uint8_t k)
{
    s->holders[k] = s->holders[--s->n];
    if (s->n == 0) {
        free(s->holders);
        s->holders = NULL;
        s->cap = 0;
        s->state = SLOT_DEAD;
        ix->used--;
        ix->dead++;
    }
}

void td_kvindex_remove(td_kvindex_t *ix, const td_kvhash_t *h, uint32_t worker)
{
    slot_t *s = find(ix, h);
    if (!s)
        return;
    for (uint8_t k = 0; k < s->n; k++) {
        if (s->holders[k].worker == worker) {
            drop_holder(ix, s, k);
            return;
        }
    }
}

void td_kvindex_remove_worker(td_kvindex_t *ix, uint32_t worker)
{
    for (size_t i = 0; i < ix->cap; i++) {
        slot_t *s = &ix->slots[i];
        for (uint8_t k = 0; s->state == SLOT_FULL && k < s->n; k++) {
            if (s->holders[k].worker == worker) {
                drop_holder(ix, s, k);
                break;
            }
        }
    }
}

int td_kvindex_tier(const td_kvindex_t *ix, const td_kvhash_t *h, uint32_t worker)
{
    const slot_t *s = find(ix, h);
    for (uint8_t k = 0; s && k < s->n; k++)
        if (s->holders[k].worker == worker)
            return s->holders[k].tier;
    return -1;
}

size_t td_kvindex_prefix(const td_kvindex_t *ix, const td_kvhash_t *hashes, size_t n,
                         uint32_t worker, uint8_t max_tier)
{
    size_t i = 0;
    for (; i < n; i++) {
        int t = td_kvindex_tier(ix, &hashes[i], worker);
        if (t < 0 || t > max_tier)
            break;
    }
    return i;
}

size_t td_kvindex_blocks(const td_kvindex_t *ix)
{
    return ix->used;
}
