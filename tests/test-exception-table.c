/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* Unit test of the striped exception table (src/exception-table.c):
 *  1. insert and look up a million exceptions, with one stripe
 *     (locking=global) and with many; duplicates refused; memory per
 *     exception at most 32 bytes;
 *  2. many copy-outs pending in one stripe at once (write-back keeps a
 *     whole commit round pending; more than 65535 in a stripe with
 *     locking=global): each found pending, none found completed until
 *     published, half published and all retired, the counts and the
 *     collected list right after;
 *  3. the four chunk states under concurrency: writer threads copy chunks
 *     out (claim → publish → drain tracked reads → retire) and then
 *     change the "origin", while reader threads read the "snapshot"
 *     through the table (completed → COW, else tracked origin read).  A
 *     reader must always see the value the chunk had at the start.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include "exception-table.h"
#include "unit-test.h"


static void
test_insert_lookup (unsigned stripe_bits)
{
  const uint64_t n = 1000000;
  struct exception_table t;
  uint64_t nc, bytes = 0;

  if (exception_table_init (&t, stripe_bits) < 0)
    FAIL ("exception_table_init");
  /* Spread keys out the way origin chunks are: every third chunk. */
  for (uint64_t i = 0; i < n; ++i)
    if (exception_table_insert (&t, i * 3, i + 1) < 0)
      FAIL ("insert %" PRIu64, i);
  if (exception_table_insert (&t, 3 * 17, 99) != -EEXIST)
    FAIL ("duplicate insert was not refused");
  for (uint64_t i = 0; i < n; ++i) {
    if (!exception_table_lookup (&t, i * 3, &nc) || nc != i + 1)
      FAIL ("lookup %" PRIu64 " (stripe bits %u)", i * 3, stripe_bits);
    if (exception_table_lookup (&t, i * 3 + 1, &nc))
      FAIL ("found a chunk that was never inserted: %" PRIu64, i * 3 + 1);
  }
  if (exception_table_count (&t) != n)
    FAIL ("count %" PRIu64 " != %" PRIu64, exception_table_count (&t), n);

  /* Remove every other exception (as a merge does) and check that the
   * rest are all still found: deletion must not break probe chains.
   */
  for (uint64_t i = 0; i < n; i += 2) {
    struct exception_stripe *s = exception_table_stripe (&t, i * 3);
    exception_stripe_lock (s);
    if (!exception_stripe_remove (s, i * 3))
      FAIL ("remove %" PRIu64 ": not found", i * 3);
    exception_stripe_unlock (s);
  }
  for (uint64_t i = 0; i < n; ++i) {
    bool found = exception_table_lookup (&t, i * 3, &nc);
    if (found != (i % 2 == 1) || (found && nc != i + 1))
      FAIL ("after removals, lookup %" PRIu64 " %s", i * 3,
            found ? "found a removed chunk or a wrong mapping" : "lost");
  }
  if (exception_table_count (&t) != n / 2)
    FAIL ("count after removals %" PRIu64, exception_table_count (&t));
  for (uint64_t i = 0; i < n; i += 2)
    if (exception_table_insert (&t, i * 3, i + 1) < 0)
      FAIL ("re-insert %" PRIu64, i);
  for (size_t i = 0; i < ((size_t) 1 << stripe_bits); ++i)
    bytes += (uint64_t) t.stripes[i].capacity * sizeof (struct completed_slot);
  printf ("%u stripe(s): %" PRIu64 " exceptions, %.1f bytes/exception "
          "in hash slots\n", 1u << stripe_bits, n, (double) bytes / n);
  /* The memory goal of the persistent store (issue 3): a reopened store
   * with a million exceptions costs at most 32 bytes per exception.
   */
  if (bytes > 32 * n)
    FAIL ("%.1f bytes per exception (goal: at most 32)", (double) bytes / n);
  exception_table_destroy (&t);
}

/* --- many pending exceptions in one stripe --- */

static void
test_many_pending (unsigned stripe_bits)
{
  const uint64_t n = 70000;
  struct exception_table t;
  struct pending_exception *pe = calloc (n, sizeof *pe);
  uint64_t nc, *chunks;
  size_t nchunks;

  if (pe == NULL || exception_table_init (&t, stripe_bits) < 0)
    FAIL ("allocating the test table");
  /* Chunks 10, 20, ...; 5 is remapped before, and is never pending. */
  if (exception_table_insert (&t, 5, 1) < 0)
    FAIL ("insert 5");
  for (uint64_t i = 0; i < n; ++i) {
    struct exception_stripe *s = exception_table_stripe (&t, (i + 1) * 10);

    exception_stripe_lock (s);
    while (exception_stripe_add_pending (&t, s, &pe[i],
                                         (i + 1) * 10) == -EAGAIN) {
      exception_stripe_unlock (s);
      if (exception_stripe_grow (s) < 0)
        FAIL ("grow");
      exception_stripe_lock (s);
    }
    exception_stripe_unlock (s);
  }
  for (uint64_t i = 0; i < n; ++i) {
    struct exception_stripe *s = exception_table_stripe (&t, (i + 1) * 10);

    exception_stripe_lock (s);
    if (!exception_stripe_is_pending (s, (i + 1) * 10))
      FAIL ("chunk %" PRIu64 " is not pending", (i + 1) * 10);
    if (exception_stripe_is_pending (s, (i + 1) * 10 + 1) ||
        exception_stripe_lookup (s, (i + 1) * 10, NULL))
      FAIL ("chunk %" PRIu64 "'s pending entry is taken for another",
            (i + 1) * 10);
    /* B → C for every other one. */
    if (i % 2 == 0)
      exception_stripe_publish (s, &pe[i], 100 + i);
    exception_stripe_unlock (s);
  }
  if (exception_table_count (&t) != 1 + (n + 1) / 2)
    FAIL ("count with pending ones published: %" PRIu64,
          exception_table_count (&t));
  for (uint64_t i = 0; i < n; ++i) {
    struct exception_stripe *s = exception_table_stripe (&t, (i + 1) * 10);

    exception_stripe_lock (s);
    exception_stripe_retire (s, &pe[i]);      /* C → D, or B → A */
    if (exception_stripe_is_pending (s, (i + 1) * 10))
      FAIL ("chunk %" PRIu64 " still pending after its retire",
            (i + 1) * 10);
    exception_stripe_unlock (s);
  }
  for (size_t i = 0; i < ((size_t) 1 << stripe_bits); ++i)
    if (t.stripes[i].npending != 0)
      FAIL ("stripe %zu: %" PRIu32 " pending after every retire", i,
            t.stripes[i].npending);
  for (uint64_t i = 0; i < n; ++i) {
    bool found = exception_table_lookup (&t, (i + 1) * 10, &nc);

    if (found != (i % 2 == 0) || (found && nc != 100 + i))
      FAIL ("after retiring, chunk %" PRIu64 " %s", (i + 1) * 10,
            found ? "has a wrong mapping or was never published" : "lost");
  }
  if (!exception_table_lookup (&t, 5, &nc) || nc != 1)
    FAIL ("chunk 5 lost among the pending ones");
  if (exception_table_collect (&t, &chunks, &nchunks) < 0)
    FAIL ("collect");
  if (nchunks != 1 + (n + 1) / 2)
    FAIL ("collect found %zu chunks, not %" PRIu64, nchunks,
          1 + (n + 1) / 2);
  for (size_t i = 0; i < nchunks; ++i)
    if (chunks[i] != 5 && (chunks[i] % 20 != 10 || chunks[i] > n * 10))
      FAIL ("collect returned chunk %" PRIu64 ", never published", chunks[i]);
  printf ("%u stripe(s): %" PRIu64 " pending at once, retired\n",
          1u << stripe_bits, n);
  free (chunks);
  free (pe);
  exception_table_destroy (&t);
}

/* --- the concurrent protocol test --- */

#define CHUNKS 4096
static struct exception_table table;
static atomic_ulong origin[CHUNKS];       /* the "origin disk" */
static atomic_ulong cow[CHUNKS + 1];      /* the "COW store" */
static atomic_ulong next_cow = 1;
static atomic_bool stop;
static atomic_long copies, origin_writes, snapshot_reads, waits;

static uint64_t
initial_value (uint64_t chunk)
{
  return chunk * 1000 + 7;
}

static void
ensure_copied (uint64_t chunk)
{
  struct exception_stripe *s = exception_table_stripe (&table, chunk);
  struct pending_exception pe;
  uint64_t nc;

  exception_stripe_lock (s);
  for (;;) {
    bool done = exception_stripe_lookup (s, chunk, NULL);
    bool pending = exception_stripe_is_pending (s, chunk);
    if (done && !pending) {
      exception_stripe_unlock (s);
      return;
    }
    if (pending) {
      atomic_fetch_add (&waits, 1);
      exception_stripe_wait (s);
      continue;
    }
    if (exception_stripe_add_pending (&table, s, &pe, chunk) == 0)
      break;
    exception_stripe_unlock (s);
    if (exception_stripe_grow (s) < 0)
      FAIL ("grow");
    exception_stripe_lock (s);
  }
  exception_stripe_unlock (s);

  /* The copy: nobody may change origin[chunk] now. */
  nc = atomic_fetch_add (&next_cow, 1);
  uint64_t v = atomic_load (&origin[chunk]);
  sched_yield ();
  if (atomic_load (&origin[chunk]) != v)
    FAIL ("origin chunk %" PRIu64 " changed during its copy-out", chunk);
  atomic_store (&cow[nc], v);

  exception_stripe_lock (s);
  exception_stripe_publish (s, &pe, nc);
  while (exception_stripe_has_tracked_reads (s, chunk))
    exception_stripe_wait (s);
  exception_stripe_retire (s, &pe);
  exception_stripe_unlock (s);
  atomic_fetch_add (&copies, 1);
}

static void *
origin_writer (void *arg)
{
  unsigned seed = (uintptr_t) arg;

  while (!atomic_load (&stop)) {
    uint64_t chunk = rand_r (&seed) % CHUNKS;
    ensure_copied (chunk);
    atomic_fetch_add (&origin[chunk], 1);   /* the origin write */
    atomic_fetch_add (&origin_writes, 1);
  }
  return NULL;
}

static void *
snapshot_reader (void *arg)
{
  unsigned seed = (uintptr_t) arg;

  while (!atomic_load (&stop)) {
    uint64_t chunk = rand_r (&seed) % CHUNKS, nc, v;
    struct exception_stripe *s = exception_table_stripe (&table, chunk);
    struct tracked_read tr;

    exception_stripe_lock (s);
    if (exception_stripe_lookup (s, chunk, &nc)) {
      exception_stripe_unlock (s);
      v = atomic_load (&cow[nc]);
    }
    else {
      exception_stripe_track_read (s, &tr, chunk);
      exception_stripe_unlock (s);
      v = atomic_load (&origin[chunk]);
      sched_yield ();           /* a read that takes a while */
      uint64_t again = atomic_load (&origin[chunk]);
      if (again != v)
        FAIL ("origin chunk %" PRIu64 " changed under a tracked read", chunk);
      exception_stripe_lock (s);
      exception_stripe_untrack_read (s, &tr);
      exception_stripe_unlock (s);
    }
    if (v != initial_value (chunk))
      FAIL ("snapshot read of chunk %" PRIu64 " saw %" PRIu64
            ", expected %" PRIu64, chunk, v, initial_value (chunk));
    atomic_fetch_add (&snapshot_reads, 1);
  }
  return NULL;
}

static void
test_concurrent_states (unsigned stripe_bits)
{
  enum { WRITERS = 4, READERS = 4 };
  pthread_t w[WRITERS], r[READERS];

  if (exception_table_init (&table, stripe_bits) < 0)
    FAIL ("exception_table_init");
  for (uint64_t i = 0; i < CHUNKS; ++i)
    atomic_store (&origin[i], initial_value (i));
  atomic_store (&next_cow, 1);
  atomic_store (&stop, false);
  atomic_store (&copies, 0);
  atomic_store (&origin_writes, 0);
  atomic_store (&snapshot_reads, 0);
  atomic_store (&waits, 0);
  for (uintptr_t i = 0; i < WRITERS; ++i)
    pthread_create (&w[i], NULL, origin_writer, (void *) (i + 1));
  for (uintptr_t i = 0; i < READERS; ++i)
    pthread_create (&r[i], NULL, snapshot_reader, (void *) (i + 100));
  sleep (2);
  atomic_store (&stop, true);
  for (int i = 0; i < WRITERS; ++i)
    pthread_join (w[i], NULL);
  for (int i = 0; i < READERS; ++i)
    pthread_join (r[i], NULL);

  /* Every chunk written was copied exactly once. */
  if (exception_table_count (&table) != (uint64_t) atomic_load (&copies))
    FAIL ("%" PRIu64 " exceptions but %ld copy-outs",
          exception_table_count (&table), atomic_load (&copies));
  for (uint64_t i = 0; i < CHUNKS; ++i) {
    uint64_t nc;
    if (exception_table_lookup (&table, i, &nc) &&
        atomic_load (&cow[nc]) != initial_value (i))
      FAIL ("COW copy of chunk %" PRIu64 " is wrong", i);
  }
  printf ("%u stripe(s): %ld origin writes, %ld copy-outs, %ld snapshot "
          "reads, %ld waits on pending exceptions: consistent\n",
          1u << stripe_bits, atomic_load (&origin_writes),
          atomic_load (&copies), atomic_load (&snapshot_reads),
          atomic_load (&waits));
  exception_table_destroy (&table);
}

/* The touched-region map: a region is marked by the first exception
 * added in it, pending or completed, and never unmarked; without a map,
 * or past its end, every region counts as touched.
 */
static void
test_touched_regions (unsigned stripe_bits)
{
  const uint64_t r = UINT64_C (1) << EXCEPTION_REGION_SHIFT;
  const uint64_t nchunks = 200 * r;
  struct exception_table t;
  struct exception_stripe *s;
  struct pending_exception pe;

  if (exception_table_init (&t, stripe_bits) < 0)
    FAIL ("exception_table_init");
  if (exception_table_untouched (&t, 0, 1))
    FAIL ("a table without a map says a region is untouched");
  if (exception_table_map_regions (&t, nchunks) < 0)
    FAIL ("exception_table_map_regions");
  if (!exception_table_untouched (&t, 0, nchunks))
    FAIL ("a new table has a touched region");
  if (exception_table_untouched (&t, nchunks - 1, nchunks + 2 * r))
    FAIL ("chunks past the map count as untouched");

  /* Region 70, by a completed exception. */
  if (exception_table_insert (&t, 70 * r + 5, 1) < 0)
    FAIL ("insert");
  if (exception_table_untouched (&t, 70 * r + 5, 70 * r + 6) ||
      exception_table_untouched (&t, 70 * r, 70 * r + 1) ||
      exception_table_untouched (&t, 0, nchunks) ||
      exception_table_untouched (&t, 69 * r + 3, 70 * r + 1))
    FAIL ("region 70 is not touched by its completed exception");
  if (!exception_table_untouched (&t, 0, 70 * r) ||
      !exception_table_untouched (&t, 71 * r, nchunks))
    FAIL ("an exception in region 70 touched another");

  /* Region 130 (its 64-bit word's second half), by a pending one, still
   * touched after the copy-out is given up.
   */
  s = exception_table_stripe (&t, 130 * r + r - 1);
  exception_stripe_lock (s);
  while (exception_stripe_add_pending (&t, s, &pe, 130 * r + r - 1)
         == -EAGAIN) {
    exception_stripe_unlock (s);
    if (exception_stripe_grow (s) < 0)
      FAIL ("grow");
    exception_stripe_lock (s);
  }
  exception_stripe_retire (s, &pe);
  exception_stripe_unlock (s);
  if (exception_table_untouched (&t, 130 * r + r - 1, 130 * r + r) ||
      exception_table_untouched (&t, 130 * r, 131 * r))
    FAIL ("region 130 is not touched by a pending exception");
  if (!exception_table_untouched (&t, 131 * r, nchunks) ||
      !exception_table_untouched (&t, 71 * r, 130 * r))
    FAIL ("a pending exception in region 130 touched another");

  /* Removing the completed exception leaves its region touched. */
  s = exception_table_stripe (&t, 70 * r + 5);
  exception_stripe_lock (s);
  if (!exception_stripe_remove (s, 70 * r + 5))
    FAIL ("remove");
  exception_stripe_unlock (s);
  if (exception_table_untouched (&t, 70 * r, 71 * r))
    FAIL ("a removed exception untouched its region");
  exception_table_destroy (&t);
}

int
main (void)
{
  test_insert_lookup (0);
  test_insert_lookup (12);
  test_many_pending (0);
  test_many_pending (12);
  test_concurrent_states (0);
  test_concurrent_states (12);
  test_touched_regions (0);
  test_touched_regions (12);
  return EXIT_SUCCESS;
}
