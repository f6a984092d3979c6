/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* nbd-check concurrency: threads with a connection each race on the
 * origin and the snapshot (origin writers, snapshot readers comparing
 * every byte with the snapshot's model, optional snapshot writers),
 * crowding on a moving "hot" chunk so that requests meet copy-outs in
 * progress; a watchdog reports a server that stops answering.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libnbd.h>

#include "nbd-check.h"

/* ---------------------------------------------------------------- */
/* concurrency                                                       */

#define MAX_THREADS 64

/* A set of locked byte ranges: overlapping holders exclude each other,
 * so the model stays exact while non-overlapping requests (including
 * ones in the same chunk) run in parallel. */
struct rangeset {
  pthread_mutex_t m;
  pthread_cond_t c;
  struct { uint64_t off, len; bool used; } r[MAX_THREADS];
};

static int
range_lock (struct rangeset *rs, uint64_t off, uint64_t len)
{
  int i, slot = -1;
  bool busy;

  pthread_mutex_lock (&rs->m);
  for (;;) {
    busy = false;
    for (i = 0; i < MAX_THREADS; ++i)
      if (rs->r[i].used && off < rs->r[i].off + rs->r[i].len &&
          rs->r[i].off < off + len)
        busy = true;
    if (!busy)
      break;
    pthread_cond_wait (&rs->c, &rs->m);
  }
  for (i = 0; i < MAX_THREADS; ++i)
    if (!rs->r[i].used) {
      slot = i;
      break;
    }
  rs->r[slot].off = off;
  rs->r[slot].len = len;
  rs->r[slot].used = true;
  pthread_mutex_unlock (&rs->m);
  return slot;
}

static void
range_unlock (struct rangeset *rs, int slot)
{
  pthread_mutex_lock (&rs->m);
  rs->r[slot].used = false;
  pthread_cond_broadcast (&rs->c);
  pthread_mutex_unlock (&rs->m);
}

enum wkind { ORIGIN_WRITER, SNAPSHOT_READER, SNAPSHOT_WRITER };

struct shared {
  uint64_t size, region, chunk, nchunks_region;
  uint8_t *orig, *oexp, *sexp;
  struct rangeset ors, srs;
  atomic_bool stop, failed;
  atomic_uint_fast64_t cursor;     /* "hot" chunk the threads crowd on */
  double deadline;
};

struct worker {
  struct shared *sh;
  enum wkind kind;
  int id;
  uint64_t rs;
  struct nbd_handle *h;
  pthread_t tid;
  uint64_t ops, bytes, oreads;
  atomic_bool done;
  _Atomic double op_start;
  char op[128];
};

/* Random request for the concurrency test, aligned to 512 bytes: half
 * of them near the hot cursor, so writers and readers meet on chunks
 * whose copy-out is in progress. */
static void
conc_pick (struct worker *w, uint64_t *offp, uint64_t *lenp)
{
  struct shared *sh = w->sh;
  uint64_t C = sh->chunk, off, len;

  if (rnd_below (&w->rs, 2) == 0) {
    uint64_t c = (atomic_load (&sh->cursor) + rnd_below (&w->rs, 6))
      % sh->nchunks_region;
    off = c * C + align_down (rnd_below (&w->rs, C), 512);
    len = align_up (1 + rnd_below (&w->rs, 2 * C), 512);
  }
  else {
    off = align_down (rnd_below (&w->rs, sh->region), 512);
    switch (rnd_below (&w->rs, 3)) {
    case 0: len = align_up (1 + rnd_below (&w->rs, C), 512); break;
    case 1: len = align_up (C + 1 + rnd_below (&w->rs, 3 * C), 512); break;
    default: len = 512 * (1 + rnd_below (&w->rs, 8)); break;
    }
  }
  if (len > 256 * 1024)
    len = 256 * 1024;
  if (off + len > sh->region)
    len = sh->region - off;
  if (len == 0) {
    off = 0;
    len = 512;
  }
  *offp = off;
  *lenp = len;
}

static void
worker_error (struct worker *w, const char *what, uint64_t off, uint64_t len)
{
  fprintf (stderr, "nbd-check: FAIL: thread %d: %s [%" PRIu64 ", +%" PRIu64
           "): %s (errno %d)\n", w->id, what, off, len, nbd_get_error (),
           nbd_get_errno ());
  atomic_store (&w->sh->failed, true);
}

static void *
worker_main (void *arg)
{
  struct worker *w = arg;
  struct shared *sh = w->sh;
  uint8_t *buf = xmalloc (256 * 1024);
  uint64_t off, len;
  int slot;
  char label[160];

  while (!atomic_load (&sh->stop) && !atomic_load (&sh->failed)) {
    if (now_s () >= sh->deadline)
      break;
    conc_pick (w, &off, &len);
    atomic_store (&w->op_start, now_s ());
    switch (w->kind) {
    case ORIGIN_WRITER:
      snprintf (w->op, sizeof w->op, "origin write [%" PRIu64 ", +%" PRIu64
                ")", off, len);
      rnd_fill (&w->rs, buf, len);
      slot = range_lock (&sh->ors, off, len);
      if (nbd_pwrite (w->h, buf, len, off,
                      rnd_below (&w->rs, 16) == 0 ? LIBNBD_CMD_FLAG_FUA : 0)
          == -1) {
        range_unlock (&sh->ors, slot);
        worker_error (w, "origin write", off, len);
        goto out;
      }
      memcpy (sh->oexp + off, buf, len);
      range_unlock (&sh->ors, slot);
      /* Move the hot spot along now and then. */
      if (rnd_below (&w->rs, 4) == 0)
        atomic_fetch_add (&sh->cursor, 1);
      break;

    case SNAPSHOT_WRITER:
      snprintf (w->op, sizeof w->op, "snapshot write [%" PRIu64 ", +%" PRIu64
                ")", off, len);
      rnd_fill (&w->rs, buf, len);
      slot = range_lock (&sh->srs, off, len);
      if (nbd_pwrite (w->h, buf, len, off, 0) == -1) {
        range_unlock (&sh->srs, slot);
        worker_error (w, "snapshot write", off, len);
        goto out;
      }
      memcpy (sh->sexp + off, buf, len);
      range_unlock (&sh->srs, slot);
      break;

    case SNAPSHOT_READER:
      snprintf (w->op, sizeof w->op, "snapshot read [%" PRIu64 ", +%" PRIu64
                ")", off, len);
      slot = range_lock (&sh->srs, off, len);
      if (nbd_pread (w->h, buf, len, off, 0) == -1) {
        range_unlock (&sh->srs, slot);
        worker_error (w, "snapshot read", off, len);
        goto out;
      }
      snprintf (label, sizeof label, "thread %d snapshot read", w->id);
      /* Comparing against the origin model is for diagnostics only. */
      if (!compare_bufs (label, sh->sexp + off, buf, sh->oexp + off,
                         "origin data (possibly racing)", off, len)) {
        range_unlock (&sh->srs, slot);
        atomic_store (&sh->failed, true);
        goto out;
      }
      range_unlock (&sh->srs, slot);
      break;
    }
    w->ops++;
    w->bytes += len;
  }
 out:
  free (buf);
  atomic_store (&w->done, true);
  return NULL;
}

int
cmd_concurrency (int argc, char **argv)
{
  struct opts o;
  struct shared sh;
  struct worker *ws;
  int i, nw, nr, nsw, total, t;
  double secs, start, elapsed;
  uint64_t piece, sum_w = 0, sum_r = 0, sum_sw = 0, bytes_w = 0, bytes_r = 0;
  struct nbd_handle *ho, *hs;

  i = parse_opts (argc, argv, &o);
  if (argc - i != 6) {
    fprintf (stderr, "usage: nbd-check concurrency [options] URI_ORIGIN "
             "URI_SNAPSHOT ORIGINAL SECONDS WRITERS READERS\n");
    return 2;
  }
  memset (&sh, 0, sizeof sh);
  pthread_mutex_init (&sh.ors.m, NULL);
  pthread_cond_init (&sh.ors.c, NULL);
  pthread_mutex_init (&sh.srs.m, NULL);
  pthread_cond_init (&sh.srs.c, NULL);
  secs = parse_u64 ("SECONDS", argv[i + 3]);
  nw = parse_u64 ("WRITERS", argv[i + 4]);
  nr = parse_u64 ("READERS", argv[i + 5]);
  nsw = o.snap_writers;
  total = nw + nr + nsw;
  if (total < 1 || total > MAX_THREADS) {
    fprintf (stderr, "nbd-check: 1..%d threads in total\n", MAX_THREADS);
    return 2;
  }
  sh.orig = load_file (argv[i + 2], &sh.size);
  sh.oexp = xmalloc (sh.size);
  sh.sexp = xmalloc (sh.size);
  memcpy (sh.oexp, sh.orig, sh.size);
  memcpy (sh.sexp, sh.orig, sh.size);
  sh.chunk = o.chunk;
  sh.region = align_down (o.region < sh.size ? o.region : sh.size, 512);
  if (sh.region < sh.chunk || sh.region < 4096)
    fail ("region too small");
  sh.nchunks_region = sh.region / sh.chunk;

  ho = do_connect (argv[i], true, true);
  hs = do_connect (argv[i + 1], true, true);
  if (nbd_get_size (ho) != (int64_t) sh.size ||
      nbd_get_size (hs) != (int64_t) sh.size)
    fail ("export sizes differ from the original image size %" PRIu64,
          sh.size);
  piece = max_request (hs);
  /* Make sure the start state is right before racing. */
  check_range (hs, "snapshot at start", sh.sexp, NULL, NULL, 0, sh.size,
               piece);

  ws = calloc (total, sizeof *ws);
  for (t = 0; t < total; ++t) {
    ws[t].sh = &sh;
    ws[t].id = t;
    ws[t].kind = t < nw ? ORIGIN_WRITER
      : t < nw + nr ? SNAPSHOT_READER : SNAPSHOT_WRITER;
    ws[t].rs = seed_init (o.seed * 1000 + t + 1);
    ws[t].h = do_connect (ws[t].kind == ORIGIN_WRITER ? argv[i] : argv[i + 1],
                          true, true);
  }
  note ("concurrency: %d origin writers, %d snapshot readers, %d snapshot "
        "writers, %.0f s, region %" PRIu64 " bytes, chunk %" PRIu64,
        nw, nr, nsw, secs, sh.region, sh.chunk);

  start = now_s ();
  sh.deadline = start + secs;
  for (t = 0; t < total; ++t) {
    int e = pthread_create (&ws[t].tid, NULL, worker_main, &ws[t]);
    if (e) {
      errno = e;
      perror ("pthread_create");
      exit (2);
    }
  }

  /* Watchdog: every thread must finish its last request soon after the
   * deadline; if not, the server is probably deadlocked. */
  for (;;) {
    bool all = true;
    for (t = 0; t < total; ++t)
      if (!atomic_load (&ws[t].done))
        all = false;
    if (all)
      break;
    if (now_s () > sh.deadline + 60) {
      fprintf (stderr, "nbd-check: FAIL: threads still busy 60 s after the "
               "deadline (deadlock in the server?)\n");
      for (t = 0; t < total; ++t)
        if (!atomic_load (&ws[t].done))
          fprintf (stderr, "nbd-check:   thread %d stuck for %.1f s in %s\n",
                   t, now_s () - atomic_load (&ws[t].op_start), ws[t].op);
      fflush (stderr);
      _exit (1);
    }
    usleep (50000);
  }
  for (t = 0; t < total; ++t)
    pthread_join (ws[t].tid, NULL);
  elapsed = now_s () - start;

  for (t = 0; t < total; ++t) {
    switch (ws[t].kind) {
    case ORIGIN_WRITER: sum_w += ws[t].ops; bytes_w += ws[t].bytes; break;
    case SNAPSHOT_READER: sum_r += ws[t].ops; bytes_r += ws[t].bytes; break;
    case SNAPSHOT_WRITER: sum_sw += ws[t].ops; break;
    }
    if (verbose)
      note ("thread %d: %" PRIu64 " ops", t, ws[t].ops);
  }
  note ("concurrency: %.1f s: %" PRIu64 " origin writes (%" PRIu64 " MiB), %"
        PRIu64 " snapshot reads (%" PRIu64 " MiB) compared, %" PRIu64
        " snapshot writes, hot cursor moved %" PRIu64 " chunks",
        elapsed, sum_w, bytes_w >> 20, sum_r, bytes_r >> 20, sum_sw,
        (uint64_t) atomic_load (&sh.cursor));

  for (t = 0; t < total; ++t)
    do_disconnect (ws[t].h);

  if (atomic_load (&sh.failed))
    fail ("concurrency: errors or mismatches reported above");
  if (nw > 0 && sum_w == 0)
    fail ("no origin write completed");
  if (nr > 0 && sum_r == 0)
    fail ("no snapshot read completed");

  /* Final state, single threaded. */
  check_range (hs, "snapshot (full read at end)", sh.sexp, sh.oexp,
               "current origin data", 0, sh.size, piece);
  if (nsw == 0 && memcmp (sh.sexp, sh.orig, sh.size) != 0)
    fail ("internal: snapshot model changed");
  check_range (ho, "origin (full read at end)", sh.oexp, NULL, NULL, 0,
               sh.size, piece);
  if (o.expect_origin)
    save_file (o.expect_origin, sh.oexp, sh.size);
  if (o.expect_snapshot)
    save_file (o.expect_snapshot, sh.sexp, sh.size);
  do_disconnect (hs);
  do_disconnect (ho);
  note ("concurrency: PASS");
  free (ws);
  free (sh.orig);
  free (sh.oexp);
  free (sh.sexp);
  return 0;
}
