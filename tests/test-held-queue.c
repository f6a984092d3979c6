/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of write-back's queue of held writes (src/writeback/
 * held-queue.c): states and their transitions, the order reads lay held
 * writes over, overlaps, the settled front the committer may apply,
 * retiring from the front, and room accounting; and of the held file's
 * records (held-record.c): encoding and decoding, the order a replay
 * takes, a torn last record, and damage that must be refused.  No
 * engine, no files, no threads but the one race below.
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "held-queue.h"
#include "held-record.h"
#include "unit-test.h"

#define OP_WRITE 0
#define OP_ZERO 1

static struct held_queue q;

static struct held_write *
hold (uint64_t offset, uint32_t count, bool ready)
{
  struct held_write *h = held_write_new (OP_WRITE, 0, offset, count, ready);

  CHECK (h != NULL);
  h->cost = held_write_cost (true, count);
  held_queue_append (&q, h);
  return h;
}

/* Retire and free whatever is queued (the tests leave nothing behind). */
static void
empty_queue (void)
{
  struct held_write *first = q.head, *last, *h, *next;

  if (first == NULL)
    return;
  for (last = first; last->next; last = last->next)
    ;
  held_queue_remove_front (&q, first, last);
  CHECK (q.head == NULL && q.held_writes == 0);
  for (h = first; h; h = next) {
    next = h == last ? NULL : h->next;
    CHECK (held_write_put (h));         /* no reader holds one */
    free (h);
  }
}

static void
free_view (struct held_view *v)
{
  for (size_t i = 0; i < v->n; ++i)
    CHECK (!held_write_put (v->w[i]));  /* the queue still holds them */
  if (v->w != v->inline_w)
    free (v->w);
}

/* Each transition of the table, and that no other is taken. */
static void
test_transitions (void)
{
  struct held_write *h = held_write_new (OP_WRITE, 0, 0, 4096, false);

  CHECK (held_write_state (h) == HELD_COPYING);
  CHECK (!held_write_settled (h));
  /* A copy failed before the acknowledgement: the writer's READY loses. */
  CHECK (held_write_transition (h, HELD_COPYING, HELD_REFUSED));
  CHECK (!held_write_transition (h, HELD_COPYING, HELD_READY));
  CHECK (!held_write_settled (h));      /* the committer waits at it */
  CHECK (held_write_transition (h, HELD_REFUSED, HELD_CANCELLED));
  CHECK (held_write_settled (h));
  CHECK (!held_write_transition (h, HELD_COPYING, HELD_CANCELLED));
  free (h);

  /* Acknowledged first: the failed copy makes it LOST, not REFUSED. */
  h = held_write_new (OP_WRITE, 0, 0, 4096, false);
  CHECK (held_write_transition (h, HELD_COPYING, HELD_READY));
  CHECK (!held_write_transition (h, HELD_COPYING, HELD_REFUSED));
  CHECK (held_write_transition (h, HELD_READY, HELD_LOST));
  CHECK (held_write_settled (h));
  CHECK (!held_write_transition (h, HELD_READY, HELD_LOST));
  free (h);

  /* Held behind others: READY at once. */
  h = held_write_new (OP_ZERO, 0, 0, 4096, true);
  CHECK (held_write_state (h) == HELD_READY);
  free (h);

  CHECK (strcmp (held_state_name (HELD_LOST), "lost") == 0);
}

/* The writer's acknowledgement and the committer's failed copy race:
 * exactly one wins, every time.
 */
struct race {
  struct held_write *h;
  bool won;
};

static void *
ack_thread (void *arg)
{
  struct race *r = arg;

  r->won = held_write_transition (r->h, HELD_COPYING, HELD_READY);
  return NULL;
}

static void *
fail_thread (void *arg)
{
  struct race *r = arg;

  r->won = held_write_transition (r->h, HELD_COPYING, HELD_REFUSED);
  return NULL;
}

static void
test_ack_against_failed_copy (void)
{
  for (int i = 0; i < 500; ++i) {
    struct held_write *h = held_write_new (OP_WRITE, 0, 0, 512, false);
    struct race a = { h, false }, f = { h, false };
    pthread_t ta, tf;

    CHECK (pthread_create (&ta, NULL, ack_thread, &a) == 0);
    CHECK (pthread_create (&tf, NULL, fail_thread, &f) == 0);
    pthread_join (ta, NULL);
    pthread_join (tf, NULL);
    CHECK (a.won != f.won);
    CHECK (held_write_state (h) == (a.won ? HELD_READY : HELD_REFUSED));
    free (h);
  }
}

/* Reads see READY writes only, in sequence order, each once, however
 * the granules and the wide list give them.
 */
static void
test_view_order (void)
{
  struct held_write *a, *b, *c, *d, *wide, *unacked;
  struct held_view v;

  held_queue_init (&q);
  a = hold (100 * 1024, 8192, true);            /* two read granules */
  wide = hold (0, 4 * 1024 * 1024, true);        /* the wide list */
  b = hold (64 * 1024, 64 * 1024, true);
  unacked = hold (96 * 1024, 4096, false);       /* COPYING: not read */
  c = hold (100 * 1024, 512, true);
  d = hold (8 * 1024 * 1024, 4096, true);        /* elsewhere */
  CHECK (q.held_writes == 6);
  CHECK (c->seq == 5 && a->seq == 1);

  held_view_init (&v);
  held_queue_collect (&q, 96 * 1024, 16 * 1024, &v);
  CHECK (!v.failed);
  CHECK (v.n == 4);
  CHECK (v.w[0] == a && v.w[1] == wide && v.w[2] == b && v.w[3] == c);
  free_view (&v);

  /* LOST and CANCELLED writes are not read either. */
  CHECK (held_write_transition (b, HELD_READY, HELD_LOST));
  CHECK (held_write_transition (unacked, HELD_COPYING, HELD_CANCELLED));
  held_view_init (&v);
  held_queue_collect (&q, 96 * 1024, 16 * 1024, &v);
  CHECK (v.n == 3 && v.w[0] == a && v.w[1] == wide && v.w[2] == c);
  free_view (&v);

  /* A range nothing covers. */
  held_view_init (&v);
  held_queue_collect (&q, 64 * 1024 * 1024, 4096, &v);
  CHECK (v.n == 0);
  CHECK (!held_queue_overlaps (&q, 64 * 1024 * 1024, 4096));
  CHECK (held_queue_overlaps (&q, 8 * 1024 * 1024 + 4095, 1));

  /* More writes than the inline array, found granule after granule in
   * the opposite of their order: sorted.
   */
  empty_queue ();
  held_queue_init (&q);
  for (int i = 0; i < 40; ++i)
    hold (65536 * (39 - i), 4096, true);
  held_view_init (&v);
  held_queue_collect (&q, 0, 40 * 65536, &v);
  CHECK (v.n == 40);
  for (size_t i = 1; i < v.n; ++i)
    CHECK (v.w[i - 1]->seq < v.w[i]->seq);
  free_view (&v);
  empty_queue ();
  (void) d;
}

/* The committer's front: settled writes only, up to the first that is
 * still copying (or refused and not yet cancelled); retiring moves
 * applied_seq and gives the indexes back.
 */
static void
test_front_and_retire (void)
{
  struct held_write *a, *b, *c, *d, *last;
  uint64_t cost;

  held_queue_init (&q);
  a = hold (0, 4096, true);
  b = hold (4096, 4096, false);
  c = hold (8192, 4096, false);
  d = hold (0, 4096, true);                      /* overlaps a */
  CHECK (held_queue_settled_end (a) == a);       /* b is copying */
  CHECK (held_write_transition (b, HELD_COPYING, HELD_READY));
  CHECK (held_write_transition (c, HELD_COPYING, HELD_REFUSED));
  CHECK (held_queue_settled_end (a) == b);       /* c waits for its writer */
  CHECK (held_write_transition (c, HELD_REFUSED, HELD_CANCELLED));
  last = held_queue_settled_end (a);
  CHECK (last == d);

  cost = held_queue_remove_front (&q, a, b);
  CHECK (cost == a->cost + b->cost);
  CHECK (q.applied_seq == b->seq);
  CHECK (q.head == c);
  CHECK (q.held_writes == 2);
  CHECK (held_queue_overlaps (&q, 0, 512));       /* d is still there */
  CHECK (held_write_put (a) && held_write_put (b));
  free (a);
  free (b);
  CHECK (q.held_bytes == c->cost + d->cost + cost);
  held_queue_charge (&q, -(int64_t) cost);      /* their memory is back */

  cost = held_queue_remove_front (&q, c, d);
  CHECK (q.head == NULL && q.tailp == &q.head);
  CHECK (q.applied_seq == d->seq);
  CHECK (q.held_writes == 0 && atomic_load (&q.nheld) == 0);
  CHECK (!held_queue_overlaps (&q, 0, 16384));
  /* Still counted until the owner gives the memory back. */
  CHECK (q.held_bytes == cost);
  held_queue_charge (&q, -(int64_t) cost);
  CHECK (q.held_bytes == 0);
  free (c);
  free (d);

  /* Appending after the queue emptied. */
  a = hold (0, 4096, true);
  CHECK (q.head == a && a->seq == 5);
  held_queue_remove_front (&q, a, a);
  free (a);
}

/* Room: writeback-max bounds what is queued plus what is charged. */
static void
test_room (void)
{
  uint64_t c4k = held_write_cost (true, 4096);
  uint64_t max = 10 * c4k;

  held_queue_init (&q);
  CHECK (held_write_cost (false, 4096) < c4k);  /* no data: header only */
  CHECK (held_write_cost (true, 4097) >= held_write_cost (true, 4096) + 4096);
  for (int i = 0; i < 9; ++i)
    hold (i * 4096, 4096, true);
  CHECK (held_queue_has_room (&q, c4k, max));
  held_queue_charge (&q, 1);                     /* a copy-out batch */
  CHECK (!held_queue_has_room (&q, c4k, max));
  held_queue_charge (&q, -1);
  CHECK (held_queue_has_room (&q, c4k, max));
  hold (9 * 4096, 4096, true);
  CHECK (!held_queue_has_room (&q, 1, max));
  empty_queue ();
}

/* --- the held file's records --- */

#define SLOTS 256
static unsigned char ring[SLOTS * HELD_RECORD_LEN];
#define DATA_OFF (1024 * 1024)
#define FILE_SIZE (64 * 1024 * 1024)

static void
put_record (uint64_t seq, uint8_t op, uint64_t offset, uint32_t count)
{
  struct held_record r = {
    .seq = seq, .offset = offset, .count = count, .op = op,
    .data_off = op == HELD_OP_WRITE ? DATA_OFF + seq * 65536 : 0,
    .data_crc = (uint32_t) seq * 7,
  };

  held_record_encode (&r, ring + ((seq - 1) % SLOTS) * HELD_RECORD_LEN);
}

static int
scan (uint64_t mark, struct held_replay *rp, char *why)
{
  return held_records_scan (ring, SLOTS, mark, DATA_OFF, FILE_SIZE,
                            16 * 1024 * 1024, rp, why, 256);
}

static void
test_records (void)
{
  struct held_record r, back;
  struct held_replay rp;
  unsigned char buf[HELD_RECORD_LEN];
  char why[256];

  /* Encode, decode. */
  r = (struct held_record) { .seq = 42, .offset = 1 << 20, .data_off = DATA_OFF,
    .count = 4096, .data_crc = 0xdeadbeef, .op = HELD_OP_WRITE,
    .flags = HELD_FLAG_MAY_TRIM };
  held_record_encode (&r, buf);
  CHECK (held_record_decode (buf, &back) == NULL);
  CHECK (back.seq == 42 && back.offset == 1 << 20 && back.count == 4096 &&
         back.data_crc == 0xdeadbeef && back.op == HELD_OP_WRITE &&
         back.flags == HELD_FLAG_MAY_TRIM && !back.dropped);
  buf[20] ^= 1;
  CHECK (held_record_decode (buf, &back) != NULL);     /* checksum */
  memset (buf, 0, sizeof buf);
  CHECK (held_record_slot_empty (buf));

  /* The replay's order: from the mark on, in sequence, across the end
   * of the ring.
   */
  memset (ring, 0, sizeof ring);
  for (uint64_t seq = 250; seq <= 265; ++seq)
    put_record (seq, seq % 3 == 0 ? HELD_OP_ZERO : HELD_OP_WRITE,
                seq * 4096, 4096);
  CHECK (scan (249, &rp, why) == 0);
  CHECK (rp.n == 16 && !rp.torn);
  for (size_t i = 0; i < rp.n; ++i)
    CHECK (rp.r[i].seq == 250 + i);
  free (rp.r);
  /* A mark past some of them: only the rest. */
  CHECK (scan (260, &rp, why) == 0);
  CHECK (rp.n == 5 && rp.r[0].seq == 261);
  free (rp.r);
  /* Nothing after the mark. */
  CHECK (scan (265, &rp, why) == 0 && rp.n == 0);
  free (rp.r);

  /* A torn last record ends the replay there. */
  ring[((265 - 1) % SLOTS) * HELD_RECORD_LEN + 20] ^= 1;
  CHECK (scan (249, &rp, why) == 0);
  CHECK (rp.n == 15 && rp.torn && rp.torn_seq == 265);
  free (rp.r);

  /* A bad record with a good one after it: changed, refused. */
  ring[((255 - 1) % SLOTS) * HELD_RECORD_LEN + 20] ^= 1;
  CHECK (scan (249, &rp, why) == -EINVAL);
  CHECK (strstr (why, "follows it") != NULL);
  CHECK (rp.r == NULL && rp.n == 0);
  put_record (255, HELD_OP_WRITE, 255 * 4096, 4096);
  put_record (265, HELD_OP_WRITE, 265 * 4096, 4096);

  /* Data past the end of the file, or an impossible length. */
  put_record (258, HELD_OP_WRITE, 0, 4096);
  {
    struct held_record bad;
    unsigned char *p = ring + ((258 - 1) % SLOTS) * HELD_RECORD_LEN;

    CHECK (held_record_decode (p, &bad) == NULL);
    bad.data_off = FILE_SIZE - 4096;
    bad.count = 8192;
    held_record_encode (&bad, p);
    CHECK (scan (249, &rp, why) == -EINVAL);
    CHECK (strstr (why, "outside the file") != NULL);
    bad.data_off = DATA_OFF;
    bad.count = 0x7fffffff;
    held_record_encode (&bad, p);
    CHECK (scan (249, &rp, why) == -EINVAL);
    CHECK (strstr (why, "larger than any held write") != NULL);
    /* A sequence number out of place. */
    bad.count = 4096;
    bad.seq = 300;
    held_record_encode (&bad, p);
    CHECK (scan (249, &rp, why) == -EINVAL);
    CHECK (strstr (why, "out of place") != NULL);
  }
  put_record (258, HELD_OP_WRITE, 258 * 4096, 4096);

  /* A record of an earlier lap where the next should be: the end. */
  put_record (266 - SLOTS, HELD_OP_WRITE, 0, 4096);
  CHECK (scan (249, &rp, why) == 0 && rp.n == 16);
  free (rp.r);

  /* The mark. */
  held_mark_encode (12345, buf);
  {
    uint64_t seq;

    CHECK (held_mark_decode (buf, &seq) == NULL && seq == 12345);
    buf[3] ^= 1;
    CHECK (held_mark_decode (buf, &seq) != NULL);
  }
}

static void
test_header (void)
{
  char stores[2][HELD_UUID_LEN] = { "11111111-2222-3333-4444-555555555555",
                                    "66666666-7777-8888-9999-000000000000" };
  struct held_header h = {
    .created = 1, .pid = 2, .boot_id = "b00t", .origin_dev = 3,
    .origin_ino = 4, .origin_size = 5, .origin_path = "/dev/vg/disk",
    .slots = 1024, .max_stores = 32, .nstores = 2, .stores = stores,
  }, back;
  struct held_layout l, lb;
  unsigned char *buf;

  held_layout_of (h.slots, h.max_stores, &l);
  CHECK (l.header_len % HELD_PAGE == 0 && l.mark_off == l.header_len);
  CHECK (l.data_off % (1024 * 1024) == 0 &&
         l.data_off >= l.ring_off + 1024 * HELD_RECORD_LEN);
  buf = malloc (l.header_len);
  CHECK (buf);
  held_header_encode (&h, &l, buf);
  CHECK (held_header_decode (buf, l.header_len, &back, &lb) == NULL);
  CHECK (strcmp (back.origin_path, "/dev/vg/disk") == 0 &&
         strcmp (back.boot_id, "b00t") == 0 && back.nstores == 2 &&
         strcmp (back.stores[1], stores[1]) == 0 && back.origin_ino == 4 &&
         lb.data_off == l.data_off);
  buf[300] ^= 1;
  CHECK (held_header_decode (buf, l.header_len, &back, &lb) != NULL);
  buf[300] ^= 1;
  memcpy (buf, "SNAPFGXX", 8);
  CHECK (held_header_decode (buf, l.header_len, &back, &lb) != NULL);
  free (buf);
}

int
main (void)
{
  test_records ();
  test_header ();
  test_transitions ();
  test_ack_against_failed_copy ();
  test_view_order ();
  test_front_and_retire ();
  test_room ();
  return 0;
}
