/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg write-back: the queue of held writes and its indexes (see
 * held-queue.h).
 *
 * Held writes are a FIFO in acknowledgement order.  Each has a sequence
 * number; the committer applies them in that order, so "every write
 * acknowledged before this flush is on the origin" is "applied_seq has
 * reached the last sequence number handed out when the flush began".
 *
 * Which origin ranges are held is kept in a small counting hash of 1 MiB
 * granules (the largest chunk size): a write or read that finds none of
 * its granules counted needs no further look.  A false positive only
 * costs a look (a read) or holds a write that could have gone straight
 * to the origin; it is never wrong.  The granule is the largest chunk so
 * that a later write to another part of a chunk whose exception is not
 * durable yet always finds the held write that copied the chunk out.
 *
 * A read that may overlap held writes finds them in the read index:
 * lists of the held writes over each 64 KiB granule (a write's links
 * live in its own allocation), and one list of the few that span more
 * granules than that.  Walking the whole FIFO instead cost every such
 * read the length of the queue, under the lock the writers take: with
 * a gigabyte of 4 KiB writes held, 262,144 entries per read.
 */

#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "held-queue.h"
#include "held-record.h"

#define OVERLAP_GRANULE_SHIFT 20  /* SNAPFG_MAX_CHUNK_SIZE */
#define READ_GRANULE_SHIFT 16     /* the read index's granule: 64 KiB */
#define READ_LINKS_MAX 18         /* more granules: the list of wide ones */

/* --- states --- */

static const char *const state_names[] = {
  [HELD_COPYING] = "copying",
  [HELD_READY] = "ready",
  [HELD_REFUSED] = "refused",
  [HELD_CANCELLED] = "cancelled",
  [HELD_LOST] = "lost",
};

const char *
held_state_name (enum held_state s)
{
  return (unsigned) s < sizeof state_names / sizeof state_names[0]
    ? state_names[s] : "?";
}

/* The table of held-queue.h, as code. */
static bool
transition_allowed (enum held_state from, enum held_state to)
{
  switch (from) {
  case HELD_COPYING:
    return to == HELD_READY || to == HELD_REFUSED || to == HELD_CANCELLED;
  case HELD_READY:
    return to == HELD_LOST;
  case HELD_REFUSED:
    return to == HELD_CANCELLED;
  case HELD_CANCELLED:
  case HELD_LOST:
    return false;
  }
  return false;
}

bool
held_write_transition (struct held_write *h, enum held_state from,
                       enum held_state to)
{
  int expected = from;

  if (!transition_allowed (from, to))
    abort ();
  /* Sequentially consistent: the committer's idle handshake
   * (writeback_ready) depends on it.
   */
  return atomic_compare_exchange_strong (&h->state, &expected, to);
}

enum held_state
held_write_state (const struct held_write *h)
{
  return atomic_load ((atomic_int *) &h->state);
}

bool
held_write_settled (const struct held_write *h)
{
  enum held_state s = held_write_state (h);

  return s != HELD_COPYING && s != HELD_REFUSED;
}

/* --- a held write --- */

/* Links a held write of count bytes may need, wherever it starts: one
 * per read granule it can touch, or one in the list of wide writes.
 */
static unsigned
links_needed (uint32_t count)
{
  uint64_t n = ((uint64_t) (count ? count - 1 : 0) >> READ_GRANULE_SHIFT) + 2;

  return n > READ_LINKS_MAX ? 1 : n;
}

static size_t
header_length (uint32_t count)
{
  return sizeof (struct held_write) +
    links_needed (count) * sizeof (struct held_link);
}

uint64_t
held_write_cost (bool with_data, uint32_t count)
{
  /* The heap's overhead counts too: writeback-max bounds memory. */
  /* Data takes whole pages of the held file (held_file_extent). */
  uint64_t data = with_data
    ? ((uint64_t) count + HELD_PAGE - 1) & ~(uint64_t) (HELD_PAGE - 1) : 0;

  return header_length (count) + 64 + data;
}

struct held_write *
held_write_new (int op, unsigned flags, uint64_t offset, uint32_t count,
                bool ready)
{
  struct held_write *h = malloc (header_length (count));

  if (h == NULL)
    return NULL;
  h->next = NULL;
  h->seq = 0;
  h->op = op;
  h->flags = flags;
  h->offset = offset;
  h->count = count;
  h->cost = 0;
  h->data_off = 0;
  h->data_extent = 0;
  atomic_init (&h->state, ready ? HELD_READY : HELD_COPYING);
  h->error = 0;
  atomic_init (&h->refs, 1);
  h->nlinks = 0;
  return h;
}

bool
held_write_put (struct held_write *h)
{
  return atomic_fetch_sub (&h->refs, 1) == 1;
}

/* --- the indexes --- */

static unsigned
index_slot (uint64_t granule)
{
  return (granule * UINT64_C (0x9E3779B97F4A7C15)) >> (64 - HELD_INDEX_BITS);
}

static void
overlap_update (struct held_queue *q, uint64_t offset, uint32_t count,
                int delta)
{
  uint64_t first = offset >> OVERLAP_GRANULE_SHIFT;
  uint64_t last = (offset + count - 1) >> OVERLAP_GRANULE_SHIFT;

  for (uint64_t g = first; g <= last; ++g)
    q->overlap_count[index_slot (g)] += delta;
}

bool
held_queue_overlaps (const struct held_queue *q, uint64_t offset,
                     uint32_t count)
{
  uint64_t first = offset >> OVERLAP_GRANULE_SHIFT;
  uint64_t last = (offset + count - 1) >> OVERLAP_GRANULE_SHIFT;

  for (uint64_t g = first; g <= last; ++g)
    if (q->overlap_count[index_slot (g)])
      return true;
  return false;
}

static void
list_append (struct held_list *l, struct held_link *k)
{
  k->next = NULL;
  *l->tailp = k;
  l->tailp = &k->next;
}

/* Remove k: at the head, since writes leave in the order they came (a
 * walk only if that ever changes).
 */
static void
list_remove (struct held_list *l, struct held_link *k)
{
  struct held_link **p = &l->head;

  while (*p != k)
    p = &(*p)->next;
  *p = k->next;
  if (*p == NULL)
    l->tailp = p;
}

static struct held_list *
list_of (struct held_queue *q, uint64_t granule)
{
  return granule == HELD_LINK_WIDE
    ? &q->wide : &q->read_lists[index_slot (granule)];
}

static void
read_index_add (struct held_queue *q, struct held_write *h)
{
  uint64_t first = h->offset >> READ_GRANULE_SHIFT;
  uint64_t last = (h->offset + h->count - 1) >> READ_GRANULE_SHIFT;

  /* (links_needed is the span's worst case, or 1 for a wide write.) */
  if (last - first + 1 > links_needed (h->count)) {
    h->nlinks = 1;
    h->links[0].granule = HELD_LINK_WIDE;
  }
  else {
    h->nlinks = last - first + 1;
    for (unsigned i = 0; i < h->nlinks; ++i)
      h->links[i].granule = first + i;
  }
  for (unsigned i = 0; i < h->nlinks; ++i) {
    h->links[i].h = h;
    list_append (list_of (q, h->links[i].granule), &h->links[i]);
  }
}

static void
read_index_remove (struct held_queue *q, struct held_write *h)
{
  for (unsigned i = 0; i < h->nlinks; ++i)
    list_remove (list_of (q, h->links[i].granule), &h->links[i]);
}

/* --- the queue --- */

void
held_queue_init (struct held_queue *q)
{
  memset (q, 0, sizeof *q);
  q->tailp = &q->head;
  for (size_t i = 0; i < sizeof q->read_lists / sizeof q->read_lists[0]; ++i)
    q->read_lists[i].tailp = &q->read_lists[i].head;
  q->wide.tailp = &q->wide.head;
  atomic_init (&q->nheld, 0);
}

void
held_queue_append (struct held_queue *q, struct held_write *h)
{
  h->seq = ++q->last_seq;
  /* Stored atomically: the committer walks the settled front of the
   * queue without the lock.
   */
  __atomic_store_n (q->tailp, h, __ATOMIC_RELEASE);
  q->tailp = &h->next;
  overlap_update (q, h->offset, h->count, 1);
  read_index_add (q, h);
  q->held_bytes += h->cost;
  q->held_writes++;
  atomic_fetch_add (&q->nheld, 1);
}

bool
held_queue_has_room (const struct held_queue *q, uint64_t cost, uint64_t max)
{
  /* The callers hold only requests that fit in max. */
  return q->held_bytes + cost <= max;
}

void
held_queue_charge (struct held_queue *q, int64_t delta)
{
  q->held_bytes += delta;
}

struct held_write *
held_queue_settled_end (struct held_write *first)
{
  struct held_write *last = first, *next;

  while ((next = __atomic_load_n (&last->next, __ATOMIC_ACQUIRE)) &&
         held_write_settled (next))
    last = next;
  return last;
}

uint64_t
held_queue_remove_front (struct held_queue *q, struct held_write *first,
                         struct held_write *last)
{
  uint64_t cost = 0;

  q->head = last->next;
  if (q->head == NULL)
    q->tailp = &q->head;
  q->applied_seq = last->seq;
  for (struct held_write *h = first; ; h = h->next) {
    overlap_update (q, h->offset, h->count, -1);
    read_index_remove (q, h);
    cost += h->cost;
    q->held_writes--;
    atomic_fetch_sub (&q->nheld, 1);
    if (h == last)
      break;
  }
  return cost;
}

/* --- what a read lays over --- */

void
held_view_init (struct held_view *v)
{
  v->n = 0;
  v->w = v->inline_w;
  v->cap = sizeof v->inline_w / sizeof v->inline_w[0];
  v->failed = false;
}

static bool
ranges_overlap (uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
  return a < b + blen && b < a + alen;
}

static void
view_add (struct held_view *v, struct held_write *h, uint32_t count,
          uint64_t offset)
{
  if (v->failed || held_write_state (h) != HELD_READY ||
      !ranges_overlap (h->offset, h->count, offset, count))
    return;
  if (v->n == v->cap) {
    size_t cap = v->cap * 2;
    struct held_write **w = malloc (cap * sizeof *w);

    if (w == NULL) {
      v->failed = true;
      return;
    }
    memcpy (w, v->w, v->n * sizeof *w);
    if (v->w != v->inline_w)
      free (v->w);
    v->w = w;
    v->cap = cap;
  }
  atomic_fetch_add (&h->refs, 1);
  v->w[v->n++] = h;
}

static int
compare_seq (const void *a, const void *b)
{
  const struct held_write *x = *(struct held_write *const *) a;
  const struct held_write *y = *(struct held_write *const *) b;

  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* In queue order, as the read lays them over (the lists give each
 * granule's in order, the granules one after another).
 */
static void
view_sort (struct held_view *v)
{
  if (v->n > 16) {
    qsort (v->w, v->n, sizeof *v->w, compare_seq);
    return;
  }
  for (size_t i = 1; i < v->n; ++i) {
    struct held_write *h = v->w[i];
    size_t j = i;

    for (; j > 0 && v->w[j - 1]->seq > h->seq; --j)
      v->w[j] = v->w[j - 1];
    v->w[j] = h;
  }
}

void
held_queue_collect (const struct held_queue *cq, uint64_t offset,
                    uint32_t count, struct held_view *v)
{
  /* (The lists are walked, not changed.) */
  struct held_queue *q = (struct held_queue *) cq;
  uint64_t first = offset >> READ_GRANULE_SHIFT;
  uint64_t last = (offset + count - 1) >> READ_GRANULE_SHIFT;

  if (!held_queue_overlaps (q, offset, count))
    return;
  for (uint64_t g = first; g <= last; ++g)
    for (struct held_link *k = list_of (q, g)->head; k; k = k->next) {
      uint64_t h_first;

      if (k->granule != g)
        continue;               /* another granule's, in the same list */
      /* Each write once: from the first granule it shares with the
       * read.
       */
      h_first = k->h->offset >> READ_GRANULE_SHIFT;
      if (g == (first > h_first ? first : h_first))
        view_add (v, k->h, count, offset);
    }
  for (struct held_link *k = q->wide.head; k; k = k->next)
    view_add (v, k->h, count, offset);
  view_sort (v);
}

void
held_view_clip (const struct held_write *h, uint64_t offset, uint32_t count,
                uint64_t *from, uint64_t *to)
{
  *from = h->offset > offset ? h->offset : offset;
  *to = h->offset + h->count < offset + count
    ? h->offset + h->count : offset + count;
}
