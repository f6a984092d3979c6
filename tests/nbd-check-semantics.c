/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* nbd-check semantics: random writes (aligned, unaligned, straddling
 * chunks, several chunks) to the origin and the snapshot, zero, fast
 * zero and trim, flush and FUA, block sizes and extents, every result
 * checked against an in-memory model of both views.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libnbd.h>

#include "nbd-check.h"

/* ---------------------------------------------------------------- */
/* Random request generator                                          */

struct geom {
  uint64_t chunk;      /* server chunk size */
  uint64_t unit;       /* alignment of aligned requests (min block size) */
  bool unaligned_ok;   /* may send byte-granular requests */
  uint64_t maxlen;     /* largest request */
};

/* Pick a random request inside [lo, hi).  Kinds: inside one chunk,
 * straddling a chunk boundary, several chunks, whole chunks, and (when
 * allowed) byte-granular.  Aligned kinds are multiples of g->unit. */
static void
pick_range (uint64_t *rs, const struct geom *g, uint64_t lo, uint64_t hi,
            uint64_t *offp, uint64_t *lenp, int *kindp)
{
  const uint64_t C = g->chunk;
  uint64_t span = hi - lo;

  for (;;) {
    uint64_t u = g->unit;
    uint64_t cs = C > g->unit ? C : g->unit;
    uint64_t off, len, base, b, before, after;
    int kind = rnd_below (rs, g->unaligned_ok ? 5 : 4);

    if (g->unaligned_ok && kind != 3 && rnd_below (rs, 2) == 0)
      u = 1;
    switch (kind) {
    case 0:                     /* within one chunk */
      base = align_down (lo + rnd_below (rs, span), cs);
      off = base + align_down (rnd_below (rs, cs), u);
      len = align_up (1 + rnd_below (rs, base + cs - off), u);
      break;
    case 1:                     /* straddles a chunk boundary */
      b = align_down (lo + rnd_below (rs, span), cs);
      before = align_up (1 + rnd_below (rs, C), u);
      after = align_up (1 + rnd_below (rs, C), u);
      if (b < lo + before)
        continue;
      off = b - before;
      len = before + after;
      break;
    case 2:                     /* several chunks, ragged ends */
      off = align_down (lo + rnd_below (rs, span), u);
      len = align_up (C + 1 + rnd_below (rs, 3 * C), u);
      break;
    case 3:                     /* whole chunks */
      off = align_down (lo + rnd_below (rs, span), cs);
      len = cs * (1 + rnd_below (rs, 3));
      break;
    default:                    /* byte-granular anywhere */
      off = lo + rnd_below (rs, span);
      len = 1 + rnd_below (rs, 2 * C);
      break;
    }
    if (off < lo || off >= hi)
      continue;
    if (len > g->maxlen)
      len = align_down (g->maxlen, g->unit);
    if (off + len > hi)
      len = hi - off;
    if (len == 0)
      continue;
    if (!g->unaligned_ok && (off % g->unit || len % g->unit))
      continue;
    *offp = off;
    *lenp = len;
    if (kindp)
      *kindp = kind;
    return;
  }
}

/* ---------------------------------------------------------------- */
/* semantics                                                         */

struct sem {
  struct opts o;
  struct geom g;
  uint64_t size, nchunks;
  uint8_t *orig, *oexp, *sexp;
  uint8_t *copied;       /* per chunk: has a snapshot exception */
  uint8_t *szeroed;      /* per chunk: zeroed/trimmed on the snapshot */
  uint64_t band_lo, band_hi;  /* chunks reserved for fast-zero tests */
  uint64_t pristine_hi;       /* [band_lo, pristine_hi) random I/O avoids */
  struct nbd_handle *ho, *ho2, *hs;
  uint64_t piece;
  uint64_t rs;
  uint64_t n_owrites, n_swrites, n_reads, n_fua;
};

static void
mark (uint8_t *map, uint64_t chunk, uint64_t off, uint64_t len)
{
  uint64_t c;
  for (c = off / chunk; c <= (off + len - 1) / chunk; ++c)
    map[c] = 1;
}

static bool
in_pristine (const struct sem *s, uint64_t off, uint64_t len)
{
  return off < s->pristine_hi && off + len > s->band_lo;
}

static void
sem_pick (struct sem *s, uint64_t *off, uint64_t *len, int *kind)
{
  do
    pick_range (&s->rs, &s->g, 0, s->size, off, len, kind);
  while (in_pristine (s, *off, *len));
}

static void
sem_verify_both (struct sem *s, uint64_t off, uint64_t len, const char *what)
{
  char label[256];
  uint64_t end = align_up (off + len, s->o.chunk);

  /* Check the whole chunks around the request: a bug may damage the
   * rest of a chunk it copied. */
  if (end > s->size)
    end = s->size;
  off = align_down (off, s->o.chunk);
  len = end - off;
  snprintf (label, sizeof label, "origin after %s", what);
  check_range (s->ho2, label, s->oexp, NULL, NULL, off, len, s->piece);
  snprintf (label, sizeof label, "snapshot after %s", what);
  check_range (s->hs, label, s->sexp, s->oexp, "current origin data",
               off, len, s->piece);
  s->n_reads += 2;
}

static void
sem_origin_write_at (struct sem *s, uint64_t off, uint64_t len, int kind)
{
  uint32_t flags = 0;
  uint8_t *buf;

  buf = xmalloc (len);
  rnd_fill (&s->rs, buf, len);
  if (rnd_below (&s->rs, 8) == 0) {
    flags = LIBNBD_CMD_FLAG_FUA;
    s->n_fua++;
  }
  if (verbose)
    note ("origin write kind %d [%" PRIu64 ", +%" PRIu64 ")%s", kind, off,
          len, flags ? " FUA" : "");
  if (write_range (s->ho, buf, off, len, s->piece, flags) == -1)
    nbd_fail ("origin write [%" PRIu64 ", +%" PRIu64 ") kind %d", off, len,
              kind);
  memcpy (s->oexp + off, buf, len);
  mark (s->copied, s->o.chunk, off, len);
  free (buf);
  s->n_owrites++;
  sem_verify_both (s, off, len, "origin write");
}

static void
sem_origin_write (struct sem *s)
{
  uint64_t off, len;
  int kind;

  sem_pick (s, &off, &len, &kind);
  sem_origin_write_at (s, off, len, kind);
}

static void
sem_snapshot_write_at (struct sem *s, uint64_t off, uint64_t len, int kind)
{
  uint8_t *buf;
  uint32_t flags = 0;

  buf = xmalloc (len);
  rnd_fill (&s->rs, buf, len);
  if (rnd_below (&s->rs, 8) == 0)
    flags = LIBNBD_CMD_FLAG_FUA;
  if (verbose)
    note ("snapshot write kind %d [%" PRIu64 ", +%" PRIu64 ")", kind, off,
          len);
  if (write_range (s->hs, buf, off, len, s->piece, flags) == -1)
    nbd_fail ("snapshot write [%" PRIu64 ", +%" PRIu64 ") kind %d", off, len,
              kind);
  memcpy (s->sexp + off, buf, len);
  mark (s->copied, s->o.chunk, off, len);
  free (buf);
  s->n_swrites++;
  sem_verify_both (s, off, len, "snapshot write");
}

static void
sem_snapshot_write (struct sem *s)
{
  uint64_t off, len;
  int kind;

  sem_pick (s, &off, &len, &kind);
  sem_snapshot_write_at (s, off, len, kind);
}

static void
sem_random_reads (struct sem *s)
{
  uint64_t off, len;

  pick_range (&s->rs, &s->g, 0, s->size, &off, &len, NULL);
  check_range (s->ho, "origin random read", s->oexp, NULL, NULL, off, len,
               s->piece);
  pick_range (&s->rs, &s->g, 0, s->size, &off, &len, NULL);
  check_range (s->hs, "snapshot random read", s->sexp, s->oexp,
               "current origin data", off, len, s->piece);
  s->n_reads += 2;
}

static void
check_block_sizes (struct nbd_handle *h, const char *name,
                   const struct opts *o)
{
  int64_t mn = nbd_get_block_size (h, LIBNBD_SIZE_MINIMUM);
  int64_t pf = nbd_get_block_size (h, LIBNBD_SIZE_PREFERRED);
  int64_t mx = nbd_get_block_size (h, LIBNBD_SIZE_MAXIMUM);

  note ("%s: block size minimum %" PRIi64 " preferred %" PRIi64
        " maximum %" PRIi64, name, mn, pf, mx);
  if (o->have_min && mn != (int64_t) o->min)
    fail ("%s: advertised minimum block size %" PRIi64 ", expected %" PRIu64,
          name, mn, o->min);
  if (o->have_pref && pf != (int64_t) o->pref)
    fail ("%s: advertised preferred block size %" PRIi64
          ", expected %" PRIu64, name, pf, o->pref);
}

static void
require_flag (const char *name, const char *what, int v)
{
  if (v == -1)
    nbd_fail ("%s: %s", name, what);
  if (v != 1)
    fail ("%s: %s is false, expected true", name, what);
}

static void
sem_zero_tests (struct sem *s)
{
  const uint64_t C = s->o.chunk;
  uint64_t cs = C > s->g.unit ? C : s->g.unit;
  uint64_t off, len, k, i;
  uint8_t *zeros;
  int r, err;

  /* 1. FAST_ZERO on a chunk that has no exception yet: needs a
   * copy-out, so the server must refuse it with ENOTSUP and change
   * nothing. */
  off = s->band_lo;
  len = cs;
  r = nbd_zero (s->ho, len, off, LIBNBD_CMD_FLAG_FAST_ZERO);
  err = nbd_get_errno ();
  if (r != -1)
    fail ("fast zero [%" PRIu64 ", +%" PRIu64 ") on a chunk without an "
          "exception succeeded; expected ENOTSUP (it needs a copy-out)",
          off, len);
  if (err != ENOTSUP)
    fail ("fast zero needing a copy-out failed with %s (%s), expected ENOTSUP",
          errno_name (err), nbd_get_error ());
  note ("fast zero needing a copy-out: ENOTSUP (ok)");
  sem_verify_both (s, off, len, "refused fast zero");

  /* 2. FAST_ZERO on chunks that already have exceptions: no copy-out
   * is needed, so it must succeed. */
  for (k = 0; k < s->nchunks; ++k) {
    uint64_t o2 = k * C;
    if (o2 % cs == 0 && o2 + cs <= s->size && !in_pristine (s, o2, cs)) {
      bool all = true;
      for (i = o2 / C; i < (o2 + cs) / C; ++i)
        if (!s->copied[i])
          all = false;
      if (all)
        break;
    }
  }
  if (k == s->nchunks)
    fail ("internal: no fully copied chunk found for the fast zero test");
  off = k * C;
  if (nbd_zero (s->ho, cs, off, LIBNBD_CMD_FLAG_FAST_ZERO) == -1)
    nbd_fail ("fast zero [%" PRIu64 ", +%" PRIu64 ") on chunks that "
              "already have exceptions (no copy-out needed)", off, cs);
  memset (s->oexp + off, 0, cs);
  sem_verify_both (s, off, cs, "fast zero of copied chunk");
  note ("fast zero not needing a copy-out: ok");

  /* 3. Plain zero on the other reserved chunk: needs a copy-out. */
  off = s->band_lo + cs;
  if (nbd_zero (s->ho, cs, off, 0) == -1)
    nbd_fail ("zero [%" PRIu64 ", +%" PRIu64 ") needing a copy-out", off, cs);
  memset (s->oexp + off, 0, cs);
  mark (s->copied, C, off, cs);
  sem_verify_both (s, off, cs, "zero needing copy-out");

  /* 4. Random zeros (some NO_HOLE, some FUA) and trims on the origin. */
  zeros = calloc (1, MAX_REQUEST);
  for (i = 0; i < 40; ++i) {
    uint32_t flags = 0;
    sem_pick (s, &off, &len, NULL);
    if (i % 3 == 1)
      flags |= LIBNBD_CMD_FLAG_NO_HOLE;
    if (i % 5 == 2)
      flags |= LIBNBD_CMD_FLAG_FUA;
    if (i % 2 == 0) {
      if (nbd_zero (s->ho, len, off, flags) == -1)
        nbd_fail ("origin zero [%" PRIu64 ", +%" PRIu64 ") flags 0x%x",
                  off, len, flags);
      memset (s->oexp + off, 0, len);
    }
    else {
      uint8_t *buf = xmalloc (len);
      if (nbd_trim (s->ho, len, off, flags & LIBNBD_CMD_FLAG_FUA) == -1)
        nbd_fail ("origin trim [%" PRIu64 ", +%" PRIu64 ")", off, len);
      /* Trimmed contents are unspecified: take what the origin says. */
      if (read_range (s->ho, buf, off, len, s->piece) == -1)
        nbd_fail ("origin read after trim");
      memcpy (s->oexp + off, buf, len);
      free (buf);
    }
    mark (s->copied, C, off, len);
    sem_verify_both (s, off, len, i % 2 ? "origin trim" : "origin zero");
  }
  free (zeros);

  /* 5. Zero on the snapshot, if offered. */
  if (nbd_can_zero (s->hs) == 1) {
    for (i = 0; i < 10; ++i) {
      sem_pick (s, &off, &len, NULL);
      if (nbd_zero (s->hs, len, off, i % 2 ? LIBNBD_CMD_FLAG_NO_HOLE : 0) == -1)
        nbd_fail ("snapshot zero [%" PRIu64 ", +%" PRIu64 ")", off, len);
      memset (s->sexp + off, 0, len);
      mark (s->copied, C, off, len);
      mark (s->szeroed, C, off, len);
      sem_verify_both (s, off, len, "snapshot zero");
    }
  }
}

/* Flags of each 512-byte sector of [lo, hi) according to extents c. */
static uint8_t *
sector_flags (const struct ext_ctx *c, uint64_t lo, uint64_t hi)
{
  uint8_t *f = calloc ((hi - lo) / 512 + 1, 1);
  size_t i;
  uint64_t o;

  for (i = 0; i < c->n; ++i)
    for (o = align_up (c->v[i].off, 512); o < c->v[i].off + c->v[i].len;
         o += 512)
      if (o >= lo && o < hi)
        f[(o - lo) / 512] = c->v[i].flags;
  return f;
}

static void
sem_extents (struct sem *s)
{
  struct ext_ctx ce, co;
  size_t i;
  uint64_t c, data = 0, holes = 0, lo, hi, o;
  uint8_t *fs, *fo;

  ce = collect_extents (s->hs, "snapshot extents", s->size);
  for (i = 0; i < ce.n; ++i) {
    if (ce.v[i].flags & LIBNBD_STATE_HOLE) {
      holes += ce.v[i].len;
      for (c = ce.v[i].off / s->o.chunk;
           c <= (ce.v[i].off + ce.v[i].len - 1) / s->o.chunk; ++c)
        if (s->copied[c] && !s->szeroed[c])
          fail ("snapshot extents: [%" PRIu64 ", +%" PRIu64 ") flags 0x%x "
                "reports a hole over chunk %" PRIu64 ", which holds copied "
                "data in the COW store", ce.v[i].off, ce.v[i].len,
                ce.v[i].flags, c);
    }
    else
      data += ce.v[i].len;
  }
  check_zero_extents ("snapshot extents", &ce, s->sexp);
  note ("snapshot extents: %zu extents, %" PRIu64 " data bytes, %" PRIu64
        " hole bytes, tile the export (ok)", ce.n, data, holes);

  co = collect_extents (s->ho, "origin extents", s->size);
  check_zero_extents ("origin extents", &co, s->oexp);
  note ("origin extents: %zu extents (ok)", co.n);

  /* Chunks without exceptions report what the origin reports. */
  lo = s->band_hi;
  hi = s->pristine_hi;
  fs = sector_flags (&ce, lo, hi);
  fo = sector_flags (&co, lo, hi);
  holes = 0;
  for (o = lo; o < hi; o += 512) {
    if (fs[(o - lo) / 512] != fo[(o - lo) / 512])
      fail ("extents at %" PRIu64 " (chunk %" PRIu64 " has no exception): "
            "snapshot reports flags 0x%x, origin reports 0x%x", o,
            o / s->o.chunk, fs[(o - lo) / 512], fo[(o - lo) / 512]);
    if (fo[(o - lo) / 512] & LIBNBD_STATE_HOLE)
      holes += 512;
  }
  note ("extents of chunks without exceptions match the origin over [%"
        PRIu64 ", %" PRIu64 ") (%" PRIu64 " hole bytes) (ok)", lo, hi, holes);
  free (fs);
  free (fo);
  free (ce.v);
  free (co.v);
}

int
cmd_semantics (int argc, char **argv)
{
  struct sem s = { 0 };
  int i;
  uint64_t k, sz, cs;
  int64_t r;

  i = parse_opts (argc, argv, &s.o);
  if (argc - i < 3 || argc - i > 4) {
    fprintf (stderr, "usage: nbd-check semantics [options] URI_ORIGIN "
             "URI_SNAPSHOT ORIGINAL [SEED]\n");
    return 2;
  }
  if (argc - i == 4)
    s.o.seed = parse_u64 ("SEED", argv[i + 3]);
  s.rs = seed_init (s.o.seed);
  s.orig = load_file (argv[i + 2], &s.size);
  s.oexp = xmalloc (s.size);
  s.sexp = xmalloc (s.size);
  memcpy (s.oexp, s.orig, s.size);
  memcpy (s.sexp, s.orig, s.size);
  s.nchunks = (s.size + s.o.chunk - 1) / s.o.chunk;
  s.copied = calloc (s.nchunks, 1);
  s.szeroed = calloc (s.nchunks, 1);

  note ("semantics: size %" PRIu64 ", chunk %" PRIu64 ", seed %" PRIu64
        ", %s requests", s.size, s.o.chunk, s.o.seed,
        s.o.aligned ? "aligned" : "aligned and unaligned");

  s.ho = do_connect (argv[i], s.o.aligned, true);
  s.ho2 = do_connect (argv[i], s.o.aligned, true);
  s.hs = do_connect (argv[i + 1], s.o.aligned, true);

  /* Sizes, flags, block sizes. */
  if ((r = nbd_get_size (s.ho)) == -1)
    nbd_fail ("origin get_size");
  if ((uint64_t) r != s.size)
    fail ("origin export size %" PRIi64 " != original image size %" PRIu64,
          r, s.size);
  if ((r = nbd_get_size (s.hs)) == -1)
    nbd_fail ("snapshot get_size");
  if ((uint64_t) r != s.size)
    fail ("snapshot export size %" PRIi64 " != original image size %" PRIu64,
          r, s.size);
  check_block_sizes (s.ho, "origin", &s.o);
  check_block_sizes (s.hs, "snapshot", &s.o);
  require_flag ("origin", "can_multi_conn", nbd_can_multi_conn (s.ho));
  require_flag ("snapshot", "can_multi_conn", nbd_can_multi_conn (s.hs));
  require_flag ("origin", "can_flush", nbd_can_flush (s.ho));
  require_flag ("snapshot", "can_flush", nbd_can_flush (s.hs));
  require_flag ("origin", "can_fua", nbd_can_fua (s.ho));
  require_flag ("snapshot", "can_fua", nbd_can_fua (s.hs));
  require_flag ("origin", "can_trim", nbd_can_trim (s.ho));
  require_flag ("origin", "can_zero", nbd_can_zero (s.ho));
  require_flag ("origin", "can_fast_zero", nbd_can_fast_zero (s.ho));
  if (nbd_is_read_only (s.ho) != 0)
    fail ("origin export is read-only");
  if (nbd_is_read_only (s.hs) != 0)
    fail ("snapshot export is read-only");

  s.g.chunk = s.o.chunk;
  s.g.unit = s.o.have_min && s.o.min ? s.o.min : 512;
  s.g.unaligned_ok = !s.o.aligned;
  s.piece = max_request (s.ho);
  if (max_request (s.hs) < s.piece)
    s.piece = max_request (s.hs);
  s.piece = align_down (s.piece, s.g.unit);
  s.g.maxlen = 4 * s.o.chunk + 2 * s.g.unit;
  if (s.g.maxlen > s.piece)
    s.g.maxlen = s.piece;

  /* Random I/O leaves [5/8, 7/8) of the export alone: its first two
   * (chunk or block sized) units are for the fast-zero tests, the rest
   * keeps chunks without exceptions until the extents check. */
  cs = s.o.chunk > s.g.unit ? s.o.chunk : s.g.unit;
  s.band_lo = align_up (s.size / 8 * 5, cs);
  s.band_hi = s.band_lo + 2 * cs;
  s.pristine_hi = align_down (s.size / 8 * 7, cs);
  if (s.pristine_hi < s.band_hi + cs || s.size < 8 * cs)
    fail ("origin too small for chunk size %" PRIu64, cs);

  /* The whole snapshot equals the original at start. */
  check_range (s.hs, "snapshot at start", s.sexp, NULL, NULL, 0, s.size,
               s.piece);
  check_range (s.ho, "origin at start", s.oexp, NULL, NULL, 0, s.size,
               s.piece);

  /* Edges: the last (possibly partial) chunk gets its exception from a
   * snapshot write of its last block; then an origin write straddles
   * the boundary into it; then the first block of the export. */
  {
    uint64_t u = s.g.unit;
    uint64_t last = align_down (s.size - 1, cs);
    sem_snapshot_write_at (&s, s.size - u, u, -1);
    if (last >= u)
      sem_origin_write_at (&s, last - u, 2 * u < s.size - last + u
                           ? 2 * u : s.size - last + u, -1);
    sem_origin_write_at (&s, 0, u, -1);
    sem_origin_write_at (&s, s.size - u, u, -1);
  }

  /* Phase A: origin writes. */
  for (k = 0; k < s.o.ops; ++k) {
    sem_origin_write (&s);
    if (k % 4 == 0)
      sem_random_reads (&s);
  }
  note ("phase A: %" PRIu64 " origin writes (%" PRIu64 " FUA): ok",
        s.n_owrites, s.n_fua);

  /* Phase B: snapshot writes mixed with origin writes. */
  for (k = 0; k < s.o.ops / 2; ++k) {
    if (rnd_below (&s.rs, 2))
      sem_snapshot_write (&s);
    else
      sem_origin_write (&s);
    if (k % 4 == 0)
      sem_random_reads (&s);
  }
  note ("phase B: %" PRIu64 " snapshot writes mixed with origin writes: ok",
        s.n_swrites);

  /* Phase C: zero, fast zero, trim. */
  sem_zero_tests (&s);
  note ("phase C: zero/trim/fast zero: ok");

  /* Phase D: flush, full comparison, extents. */
  if (nbd_flush (s.ho, 0) == -1)
    nbd_fail ("origin flush");
  if (nbd_flush (s.hs, 0) == -1)
    nbd_fail ("snapshot flush");
  check_range (s.ho, "origin (full read at end)", s.oexp, NULL, NULL, 0,
               s.size, s.piece);
  check_range (s.ho2, "origin (full read at end, 2nd connection)", s.oexp,
               NULL, NULL, 0, s.size, s.piece);
  check_range (s.hs, "snapshot (full read at end)", s.sexp, s.oexp,
               "current origin data", 0, s.size, s.piece);
  sem_extents (&s);

  /* A fresh connection sees the same. */
  {
    struct nbd_handle *h3 = do_connect (argv[i + 1], s.o.aligned, true);
    check_range (h3, "snapshot (new connection)", s.sexp, s.oexp,
                 "current origin data", 0, s.size, s.piece);
    do_disconnect (h3);
  }

  sz = 0;
  for (k = 0; k < s.nchunks; ++k)
    sz += s.copied[k];
  note ("semantics: %" PRIu64 " origin writes, %" PRIu64 " snapshot writes, "
        "%" PRIu64 " verifying reads, %" PRIu64 "/%" PRIu64
        " chunks with exceptions: PASS",
        s.n_owrites, s.n_swrites, s.n_reads, sz, s.nchunks);

  if (s.o.expect_origin)
    save_file (s.o.expect_origin, s.oexp, s.size);
  if (s.o.expect_snapshot)
    save_file (s.o.expect_snapshot, s.sexp, s.size);

  do_disconnect (s.hs);
  do_disconnect (s.ho2);
  do_disconnect (s.ho);
  free (s.orig);
  free (s.oexp);
  free (s.sexp);
  free (s.copied);
  free (s.szeroed);
  return 0;
}
