/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* nbd-check failure: fill a small COW store and check what the design
 * promises when it is full (docs/design.md section 6): Invalid (every
 * snapshot request fails with EIO, the origin works on) or Overflow
 * (snapshot writes needing a new chunk fail with ENOSPC, the snapshot
 * stays readable).
 */

#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libnbd.h>

#include "nbd-check.h"

/* ---------------------------------------------------------------- */
/* failure                                                           */

/* Failures of independent checks are counted and reported, and the
 * command carries on; it fails at the end if any were seen. */
static unsigned deferred_failures;

static void
deferred_fail (const char *fmt, ...) __attribute__ ((format (printf, 1, 2)));
static void
deferred_fail (const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vreport_failure (fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
  deferred_failures++;
}

/* Expect a request to fail with a given errno. r is its result. */
static void
expect_errno (int r, int want, const char *what)
{
  int err = nbd_get_errno ();

  if (r != -1)
    deferred_fail ("%s succeeded, expected it to fail with %s", what,
                   errno_name (want));
  else if (err != want)
    deferred_fail ("%s failed with %s (%s), expected %s", what,
                   errno_name (err), nbd_get_error (), errno_name (want));
  else
    note ("%s: %s (ok)", what, errno_name (want));
}

/* Every kind of request on an Invalid snapshot fails with EIO. */
static void
check_snapshot_invalid (struct nbd_handle *hs, const char *uri_s,
                        uint64_t chunk, uint64_t copied_off,
                        uint64_t uncopied_off)
{
  uint8_t *buf = xmalloc (chunk);
  struct nbd_handle *h2;
  nbd_extent_callback cb;
  struct ext_ctx ce = { .size = UINT64_MAX };

  expect_errno (nbd_pread (hs, buf, chunk, copied_off, 0), EIO,
                "snapshot read of a copied chunk after Invalid");
  expect_errno (nbd_pread (hs, buf, chunk, uncopied_off, 0), EIO,
                "snapshot read of an uncopied chunk after Invalid");
  expect_errno (nbd_pread (hs, buf, 512, uncopied_off + 512, 0), EIO,
                "snapshot sub-chunk read after Invalid");
  memset (buf, 0x5a, chunk);
  expect_errno (nbd_pwrite (hs, buf, chunk, copied_off, 0), EIO,
                "snapshot write after Invalid");
  if (nbd_can_zero (hs) == 1)
    expect_errno (nbd_zero (hs, chunk, uncopied_off, 0), EIO,
                  "snapshot zero after Invalid");
  if (nbd_can_meta_context (hs, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1) {
    cb = (nbd_extent_callback) { .callback = extent_cb, .user_data = &ce };
    ce.next = uncopied_off;
    expect_errno (nbd_block_status (hs, chunk, uncopied_off, cb, 0), EIO,
                  "snapshot block status after Invalid");
    free (ce.v);
  }
  /* A new connection to the snapshot: it may be refused, but if it is
   * accepted its requests must fail with EIO too. */
  h2 = nbd_create ();
  if (!h2)
    nbd_fail ("nbd_create");
  if (nbd_connect_uri (h2, uri_s) == -1)
    note ("new connection to the Invalid snapshot refused: %s",
          nbd_get_error ());
  else {
    expect_errno (nbd_pread (h2, buf, 512, uncopied_off, 0), EIO,
                  "read on a new connection to the Invalid snapshot");
    nbd_shutdown (h2, 0);
  }
  nbd_close (h2);
  /* Flush last: "every request" includes flush (docs/design.md section 6). */
  expect_errno (nbd_flush (hs, 0), EIO, "snapshot flush after Invalid");
  free (buf);
}

int
cmd_failure (int argc, char **argv)
{
  struct opts o;
  const char *mode;
  const char *uri_o, *uri_s;
  uint8_t *orig, *oexp, *sexp, *buf;
  uint64_t size, C, nchunks, stride, held = 0, k, off, piece, limit;
  struct nbd_handle *ho, *hs;
  int i, r;
  bool invalid = false;

  if (argc < 2) {
    fprintf (stderr, "usage: nbd-check failure invalid|overflow|"
             "overflow-invalid [options] URI_ORIGIN URI_SNAPSHOT ORIGINAL\n");
    return 2;
  }
  mode = argv[1];
  if (strcmp (mode, "invalid") && strcmp (mode, "overflow") &&
      strcmp (mode, "overflow-invalid")) {
    fprintf (stderr, "nbd-check: unknown failure mode '%s'\n", mode);
    return 2;
  }
  i = parse_opts (argc - 1, argv + 1, &o) + 1;
  if (argc - i != 3) {
    fprintf (stderr, "usage: nbd-check failure MODE [options] URI_ORIGIN "
             "URI_SNAPSHOT ORIGINAL\n");
    return 2;
  }
  uri_o = argv[i];
  uri_s = argv[i + 1];
  if (!o.have_min_held)
    o.min_held = o.cow_chunks;
  C = o.chunk;
  orig = load_file (argv[i + 2], &size);
  oexp = xmalloc (size);
  sexp = xmalloc (size);
  memcpy (oexp, orig, size);
  memcpy (sexp, orig, size);
  nchunks = size / C;
  if (nchunks < 2 * (o.cow_chunks + 8))
    fail ("origin too small: need at least %" PRIu64 " chunks",
          2 * (o.cow_chunks + 8));
  stride = nchunks / (o.cow_chunks + 8);
  limit = o.cow_chunks + 2;     /* distinct chunks we try at most */
  buf = xmalloc (C);
  uint64_t rs = seed_init (o.seed);

  ho = do_connect (uri_o, true, true);
  hs = do_connect (uri_s, true, true);
  piece = max_request (ho);
  expect_status (uri_o, "/");   /* dm status line "<alloc>/<total> <meta>" */

  if (strcmp (mode, "invalid") == 0) {
    /* Origin writes to distinct chunks until the store is full. */
    for (k = 0; k <= limit; ++k) {
      off = k * stride * C;
      rnd_fill (&rs, buf, C);
      if (nbd_pwrite (ho, buf, C, off, 0) == -1)
        nbd_fail ("origin write #%" PRIu64 " at %" PRIu64 " (origin writes "
                  "must succeed even when the COW store is full)", k, off);
      memcpy (oexp + off, buf, C);
      r = nbd_pread (hs, buf, C, off, 0);
      if (r == -1) {
        int err = nbd_get_errno ();
        if (err != EIO)
          fail ("snapshot read after origin write #%" PRIu64 " failed with "
                "%s (%s), expected EIO", k, errno_name (err),
                nbd_get_error ());
        invalid = true;
        break;
      }
      if (!compare_bufs ("snapshot chunk after origin write", sexp + off, buf,
                         oexp + off, "new origin data", off, C))
        fail ("snapshot lost the old contents of chunk %" PRIu64,
              off / C);
      held++;
    }
    if (!invalid)
      fail ("snapshot still valid after copy-outs of %" PRIu64 " chunks "
            "with a COW store of %" PRIu64 " chunks", held, o.cow_chunks);
    note ("snapshot became Invalid after %" PRIu64 " copied chunks "
          "(store holds %" PRIu64 ")", held, o.cow_chunks);
    if (held > o.cow_chunks)
      fail ("store held %" PRIu64 " chunks, more than cow-size allows (%"
            PRIu64 ")", held, o.cow_chunks);
    if (held < o.min_held)
      fail ("store held only %" PRIu64 " chunks before Invalid, expected "
            "at least %" PRIu64, held, o.min_held);
    /* The origin keeps working. */
    for (k = 0; k < 4; ++k) {
      off = (k * stride + stride / 2) * C + 512;
      rnd_fill (&rs, buf, C);
      if (nbd_pwrite (ho, buf, C, off, k == 1 ? LIBNBD_CMD_FLAG_FUA : 0) == -1)
        nbd_fail ("origin write after Invalid at %" PRIu64, off);
      memcpy (oexp + off, buf, C);
    }
    if (nbd_flush (ho, 0) == -1)
      nbd_fail ("origin flush after Invalid");
    check_snapshot_invalid (hs, uri_s, C, 0, (limit + 3) * stride * C);
    check_range (ho, "origin after Invalid", oexp, NULL, NULL, 0, size,
                 piece);
    expect_status (uri_o, "Invalid");
  }
  else {
    uint64_t failed_off = 0;
    bool overflow = false;

    /* Snapshot writes of whole chunks to distinct chunks until one
     * does not fit. */
    for (k = 0; k <= limit; ++k) {
      off = k * stride * C;
      rnd_fill (&rs, buf, C);
      r = nbd_pwrite (hs, buf, C, off, 0);
      if (r == -1) {
        int err = nbd_get_errno ();
        if (err != ENOSPC)
          fail ("snapshot write #%" PRIu64 " failed with %s (%s), expected "
                "ENOSPC", k, errno_name (err), nbd_get_error ());
        overflow = true;
        failed_off = off;
        break;
      }
      memcpy (sexp + off, buf, C);
      held++;
    }
    if (!overflow)
      fail ("%" PRIu64 " snapshot writes to new chunks succeeded with a COW "
            "store of %" PRIu64 " chunks (expected ENOSPC)", held,
            o.cow_chunks);
    note ("snapshot write #%" PRIu64 " (needing a new chunk) failed with "
          "ENOSPC after %" PRIu64 " chunks", held, held);
    if (held > o.cow_chunks)
      fail ("store held %" PRIu64 " chunks, more than cow-size allows (%"
            PRIu64 ")", held, o.cow_chunks);
    if (held < o.min_held)
      fail ("store held only %" PRIu64 " chunks before ENOSPC, expected at "
            "least %" PRIu64, held, o.min_held);

    /* Still valid and readable; the failed write changed nothing. */
    check_range (hs, "snapshot after overflow", sexp, NULL, NULL, 0, size,
                 piece);
    check_range (ho, "origin after snapshot overflow", oexp, NULL, NULL, 0,
                 size, piece);
    /* The same write fails the same way again. */
    rnd_fill (&rs, buf, C);
    expect_errno (nbd_pwrite (hs, buf, C, failed_off, 0), ENOSPC,
                  "repeated snapshot write to a new chunk after Overflow");
    expect_errno (nbd_pwrite (hs, buf, 512, failed_off + 512, 0), ENOSPC,
                  "sub-chunk snapshot write to a new chunk after Overflow");
    /* Writes to chunks the snapshot already has still work. */
    rnd_fill (&rs, buf, C);
    if (nbd_pwrite (hs, buf, 1024, 512, 0) == -1)
      nbd_fail ("snapshot sub-chunk write to an allocated chunk after "
                "Overflow");
    memcpy (sexp + 512, buf, 1024);
    if (nbd_pwrite (hs, buf, C, stride * C, LIBNBD_CMD_FLAG_FUA) == -1)
      nbd_fail ("snapshot whole-chunk write to an allocated chunk after "
                "Overflow");
    memcpy (sexp + stride * C, buf, C);
    /* Origin writes to chunks that have exceptions need no copy-out. */
    rnd_fill (&rs, buf, C);
    if (nbd_pwrite (ho, buf, C, 0, 0) == -1)
      nbd_fail ("origin write to a chunk with an exception after Overflow");
    memcpy (oexp, buf, C);
    if (nbd_flush (hs, 0) == -1)
      nbd_fail ("snapshot flush after Overflow");
    check_range (hs, "snapshot after Overflow and more writes", sexp, oexp,
                 "current origin data", 0, size, piece);
    check_range (ho, "origin after Overflow and more writes", oexp, NULL,
                 NULL, 0, size, piece);
    expect_status (uri_o, "Overflow");

    if (strcmp (mode, "overflow-invalid") == 0) {
      /* An origin write that needs a copy-out cannot get one now. */
      rnd_fill (&rs, buf, C);
      if (nbd_pwrite (ho, buf, C, failed_off, 0) == -1)
        nbd_fail ("origin write needing a copy-out with a full store "
                  "(must succeed)");
      memcpy (oexp + failed_off, buf, C);
      check_snapshot_invalid (hs, uri_s, C, 0, failed_off + stride * C);
      check_range (ho, "origin after Invalid", oexp, NULL, NULL, 0, size,
                   piece);
      expect_status (uri_o, "Invalid");
    }
  }

  if (o.expect_origin)
    save_file (o.expect_origin, oexp, size);
  do_disconnect (hs);
  do_disconnect (ho);
  if (deferred_failures)
    fail ("failure %s: %u check(s) failed (see above)", mode,
          deferred_failures);
  note ("failure %s: PASS", mode);
  free (buf);
  free (orig);
  free (oexp);
  free (sexp);
  return 0;
}
