/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: striped exception tables (see exception-table.h). */

#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include "exception-table.h"
#include "store.h"                  /* SNAPFG_MAX_COW_CHUNKS */

/* Within a stripe, slots are found with a second, independent hash
 * (the splitmix64 finaliser), because every chunk in a stripe shares the
 * top bits of the stripe hash.
 */
static inline uint64_t
slot_hash (uint64_t key)
{
  key ^= key >> 30;
  key *= UINT64_C (0xbf58476d1ce4e5b9);
  key ^= key >> 27;
  key *= UINT64_C (0x94d049bb133111eb);
  key ^= key >> 31;
  return key;
}

/* Keys: a completed exception's is old_chunk + 1 (0 is an empty slot), a
 * pending one's the same with the top bit set (origin chunks are far
 * below 2^63).  A pending slot's new_chunk means nothing.
 */
#define PENDING_KEY_BIT (UINT64_C (1) << 63)

static inline uint64_t
completed_key (uint64_t old_chunk)
{
  return old_chunk + 1;
}

static inline uint64_t
pending_key (uint64_t old_chunk)
{
  return (old_chunk + 1) | PENDING_KEY_BIT;
}

/* Keep the hash at most 3/4 full, counting reserved entries. */
static inline bool
has_room_for (uint32_t capacity, uint64_t entries)
{
  return entries * 4 <= (uint64_t) capacity * 3;
}

/* The slots a stripe uses or has reserved, plus 'more'. */
static inline uint64_t
entries_with (const struct exception_stripe *s, uint64_t more)
{
  return (uint64_t) s->ncompleted + 2 * (uint64_t) s->npending + more;
}

int
exception_table_init (struct exception_table *t, unsigned stripe_bits)
{
  size_t n = (size_t) 1 << stripe_bits;

  t->stripes = aligned_alloc (SNAPFG_CACHELINE,
                              n * sizeof (struct exception_stripe));
  if (t->stripes == NULL)
    return -ENOMEM;
  t->stripe_bits = stripe_bits;
  t->touched = NULL;            /* every region touched until mapped */
  t->nregions = 0;
  for (size_t i = 0; i < n; ++i) {
    struct exception_stripe *s = &t->stripes[i];

    memset (s, 0, sizeof *s);
    pthread_mutex_init (&s->lock, NULL);
    pthread_cond_init (&s->changed, NULL);
  }
  return 0;
}

int
exception_table_map_regions (struct exception_table *t, uint64_t nchunks)
{
  uint64_t nregions = (nchunks >> EXCEPTION_REGION_SHIFT) + 1;

  t->touched = calloc ((nregions + 63) / 64, sizeof *t->touched);
  if (t->touched == NULL)
    return -ENOMEM;
  t->nregions = nregions;
  return 0;
}

/* Before an exception of old_chunk is visible to anyone.  Every
 * copy-out comes here: only the region's first one writes the shared
 * word (a load is enough once the bit is set, and bits are never
 * cleared), so that the copy-outs of busy neighbouring regions do not
 * pass its cache line to and fro.
 */
static void
mark_touched (struct exception_table *t, uint64_t old_chunk)
{
  uint64_t region = old_chunk >> EXCEPTION_REGION_SHIFT;
  uint64_t bit = UINT64_C (1) << (region % 64);

  if (t->touched && region < t->nregions &&
      !(atomic_load_explicit (&t->touched[region / 64],
                              memory_order_acquire) & bit))
    atomic_fetch_or (&t->touched[region / 64], bit);
}

bool
exception_table_untouched (const struct exception_table *t,
                           uint64_t first, uint64_t end)
{
  uint64_t region = first >> EXCEPTION_REGION_SHIFT;
  uint64_t last = (end - 1) >> EXCEPTION_REGION_SHIFT;

  if (t->touched == NULL || end <= first || last >= t->nregions)
    return false;
  for (; region <= last; ++region)
    if (atomic_load (&t->touched[region / 64]) &
        (UINT64_C (1) << (region % 64)))
      return false;
  return true;
}

void
exception_table_destroy (struct exception_table *t)
{
  size_t n = (size_t) 1 << t->stripe_bits;

  free (t->touched);
  t->touched = NULL;

  if (t->stripes == NULL)
    return;
  for (size_t i = 0; i < n; ++i) {
    pthread_cond_destroy (&t->stripes[i].changed);
    pthread_mutex_destroy (&t->stripes[i].lock);
    free (t->stripes[i].slots);
  }
  free (t->stripes);
  t->stripes = NULL;
}

/* Linear probing.  Returns the slot holding key, or the empty slot where it
 * would go.  Requires capacity > 0 and at least one empty slot.
 */
static struct completed_slot *
probe (struct completed_slot *slots, uint32_t capacity, uint64_t key)
{
  uint32_t mask = capacity - 1;
  uint32_t i = slot_hash (key) & mask;

  while (slots[i].key != 0 && slots[i].key != key)
    i = (i + 1) & mask;
  return &slots[i];
}

bool
exception_stripe_lookup (const struct exception_stripe *s,
                         uint64_t old_chunk, uint64_t *new_chunk)
{
  const struct completed_slot *slot;

  if (s->ncompleted == 0)
    return false;
  slot = probe (s->slots, s->capacity, completed_key (old_chunk));
  if (slot->key == 0)
    return false;
  if (new_chunk)
    *new_chunk = slot->new_chunk;
  return true;
}

bool
exception_stripe_is_pending (const struct exception_stripe *s,
                             uint64_t old_chunk)
{
  if (s->npending == 0)
    return false;
  return probe (s->slots, s->capacity, pending_key (old_chunk))->key != 0;
}

bool
exception_stripe_has_tracked_reads (const struct exception_stripe *s,
                                    uint64_t old_chunk)
{
  for (const struct tracked_read *tr = s->tracked; tr; tr = tr->next)
    if (tr->old_chunk == old_chunk)
      return true;
  return false;
}

int
exception_stripe_add_pending (struct exception_table *t,
                              struct exception_stripe *s,
                              struct pending_exception *pe,
                              uint64_t old_chunk)
{
  struct completed_slot *slot;

  /* Its own slot, and the one its completed exception will take. */
  if (s->capacity == 0 || !has_room_for (s->capacity, entries_with (s, 2)))
    return -EAGAIN;
  mark_touched (t, old_chunk);
  pe->old_chunk = old_chunk;
  slot = probe (s->slots, s->capacity, pending_key (old_chunk));
  slot->key = pending_key (old_chunk);
  slot->new_chunk = 0;
  s->npending++;
  return 0;
}

static void
insert_slot (struct completed_slot *slots, uint32_t capacity,
             uint64_t key, uint64_t new_chunk)
{
  struct completed_slot *slot = probe (slots, capacity, key);

  slot->key = key;
  slot->new_chunk = new_chunk;
}

void
exception_stripe_publish (struct exception_stripe *s,
                          struct pending_exception *pe, uint64_t new_chunk)
{
  insert_slot (s->slots, s->capacity, completed_key (pe->old_chunk),
               new_chunk);
  s->ncompleted++;
}

/* Empty a used slot.  Backward-shift deletion keeps linear probing
 * correct without tombstones: later members of the cluster move into the
 * hole when their home slot does not lie between the hole and them.
 */
static void
delete_slot (struct exception_stripe *s, struct completed_slot *slot)
{
  uint32_t mask = s->capacity - 1, hole, i;

  hole = slot - s->slots;
  for (i = (hole + 1) & mask; s->slots[i].key != 0; i = (i + 1) & mask) {
    uint32_t home = slot_hash (s->slots[i].key) & mask;
    bool movable = hole <= i ? (home <= hole || home > i)
                             : (home <= hole && home > i);
    if (movable) {
      s->slots[hole] = s->slots[i];
      hole = i;
    }
  }
  s->slots[hole].key = 0;
  s->slots[hole].new_chunk = 0;
}

void
exception_stripe_retire (struct exception_stripe *s,
                         struct pending_exception *pe)
{
  struct completed_slot *slot = probe (s->slots, s->capacity,
                                       pending_key (pe->old_chunk));

  if (slot->key)
    delete_slot (s, slot);
  s->npending--;
  if (s->nwaiters)
    pthread_cond_broadcast (&s->changed);
}

bool
exception_stripe_remove (struct exception_stripe *s, uint64_t old_chunk)
{
  struct completed_slot *slot;

  if (s->ncompleted == 0)
    return false;
  slot = probe (s->slots, s->capacity, completed_key (old_chunk));
  if (slot->key == 0)
    return false;
  delete_slot (s, slot);
  s->ncompleted--;
  return true;
}

void
exception_stripe_track_read (struct exception_stripe *s,
                             struct tracked_read *tr, uint64_t old_chunk)
{
  tr->old_chunk = old_chunk;
  tr->prev = NULL;
  tr->next = s->tracked;
  if (s->tracked)
    s->tracked->prev = tr;
  s->tracked = tr;
}

void
exception_stripe_untrack_read (struct exception_stripe *s,
                               struct tracked_read *tr)
{
  if (tr->prev)
    tr->prev->next = tr->next;
  else
    s->tracked = tr->next;
  if (tr->next)
    tr->next->prev = tr->prev;
  /* Only a copy-out waiting to retire its pending exception cares. */
  if (s->nwaiters)
    pthread_cond_broadcast (&s->changed);
}

void
exception_stripe_wait (struct exception_stripe *s)
{
  s->nwaiters++;
  pthread_cond_wait (&s->changed, &s->lock);
  s->nwaiters--;
}

int
exception_stripe_grow (struct exception_stripe *s)
{
  uint32_t capacity;
  struct completed_slot *slots, *old_slots;

  /* Decide the size under the lock, allocate without it, then install
   * under the lock unless someone else grew the stripe meanwhile.
   */
  exception_stripe_lock (s);
  capacity = s->capacity ? s->capacity : 8;
  while (!has_room_for (capacity, entries_with (s, 2)))
    capacity *= 2;
  if (capacity == s->capacity) {
    exception_stripe_unlock (s);
    return 0;
  }
  exception_stripe_unlock (s);

  if (capacity > UINT32_C (1) << 31)
    return -ENOMEM;
  slots = calloc (capacity, sizeof *slots);
  if (slots == NULL)
    return -ENOMEM;

  exception_stripe_lock (s);
  if (s->capacity >= capacity ||
      !has_room_for (capacity, entries_with (s, 2))) {
    /* Raced with another grower (or with new pending entries); let the
     * caller re-check and call us again if still needed.
     */
    exception_stripe_unlock (s);
    free (slots);
    return 0;
  }
  for (uint32_t i = 0; i < s->capacity; ++i)
    if (s->slots[i].key)
      insert_slot (slots, capacity, s->slots[i].key, s->slots[i].new_chunk);
  old_slots = s->slots;
  s->slots = slots;
  s->capacity = capacity;
  exception_stripe_unlock (s);

  free (old_slots);
  return 0;
}

int
exception_table_insert (struct exception_table *t,
                        uint64_t old_chunk, uint64_t new_chunk)
{
  struct exception_stripe *s = exception_table_stripe (t, old_chunk);
  int r;

  if (new_chunk > SNAPFG_MAX_COW_CHUNKS)
    return -ERANGE;
  for (;;) {
    exception_stripe_lock (s);
    if (s->capacity && has_room_for (s->capacity, entries_with (s, 1))) {
      /* One probe finds either the chunk or where it goes. */
      struct completed_slot *slot = probe (s->slots, s->capacity,
                                           completed_key (old_chunk));
      r = 0;
      if (slot->key != 0)
        r = -EEXIST;
      else {
        mark_touched (t, old_chunk);
        slot->key = completed_key (old_chunk);
        slot->new_chunk = new_chunk;
        s->ncompleted++;
      }
      exception_stripe_unlock (s);
      return r;
    }
    exception_stripe_unlock (s);
    r = exception_stripe_grow (s);
    if (r < 0)
      return r;
  }
}

bool
exception_table_lookup (const struct exception_table *t,
                        uint64_t old_chunk, uint64_t *new_chunk)
{
  struct exception_stripe *s = exception_table_stripe (t, old_chunk);
  bool found;

  exception_stripe_lock (s);
  found = exception_stripe_lookup (s, old_chunk, new_chunk);
  exception_stripe_unlock (s);
  return found;
}

uint64_t
exception_table_count (struct exception_table *t)
{
  size_t n = (size_t) 1 << t->stripe_bits;
  uint64_t count = 0;

  for (size_t i = 0; i < n; ++i) {
    exception_stripe_lock (&t->stripes[i]);
    count += t->stripes[i].ncompleted;
    exception_stripe_unlock (&t->stripes[i]);
  }
  return count;
}

uint64_t
exception_table_contention (struct exception_table *t)
{
  size_t n = (size_t) 1 << t->stripe_bits;
  uint64_t contended = 0;

  for (size_t i = 0; i < n; ++i) {
    exception_stripe_lock (&t->stripes[i]);
    contended += t->stripes[i].contended;
    exception_stripe_unlock (&t->stripes[i]);
  }
  return contended;
}

int
exception_table_collect (struct exception_table *t,
                         uint64_t **chunksp, size_t *np)
{
  size_t nstripes = (size_t) 1 << t->stripe_bits;

  for (;;) {
    /* Size the array without holding any lock, fill it stripe by stripe
     * (no allocation under a stripe lock), and start again if the table
     * grew past it meanwhile.
     */
    size_t cap = exception_table_count (t) + 64, n = 0;
    uint64_t *chunks = malloc (cap * sizeof *chunks);
    bool overflow = false;

    if (chunks == NULL)
      return -ENOMEM;
    for (size_t i = 0; i < nstripes && !overflow; ++i) {
      struct exception_stripe *s = &t->stripes[i];

      exception_stripe_lock (s);
      if (n + s->ncompleted > cap)
        overflow = true;
      else
        for (uint32_t j = 0; j < s->capacity; ++j)
          if (s->slots[j].key && !(s->slots[j].key & PENDING_KEY_BIT))
            chunks[n++] = s->slots[j].key - 1;
      exception_stripe_unlock (s);
    }
    if (!overflow) {
      *chunksp = chunks;
      *np = n;
      return 0;
    }
    free (chunks);
  }
}
