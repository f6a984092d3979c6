/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* nbd-check: what every subcommand shares (see nbd-check.h). */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <libnbd.h>

#include "nbd-check.h"

bool verbose;

/* ---------------------------------------------------------------- */
/* Messages and failure                                              */

/* Handles opened by the main thread, closed cleanly on failure. */
static struct nbd_handle *open_handles[256];
static size_t n_open_handles;

void
note (const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  fputs ("nbd-check: ", stdout);
  vfprintf (stdout, fmt, ap);
  fputc ('\n', stdout);
  fflush (stdout);
  va_end (ap);
}

static void
close_all_handles (void)
{
  size_t i;

  for (i = 0; i < n_open_handles; ++i) {
    if (open_handles[i]) {
      nbd_shutdown (open_handles[i], 0);
      nbd_close (open_handles[i]);
      open_handles[i] = NULL;
    }
  }
  n_open_handles = 0;
}

void
vreport_failure (const char *fmt, va_list ap)
{
  fflush (stdout);
  fputs ("nbd-check: FAIL: ", stderr);
  vfprintf (stderr, fmt, ap);
}

void
fail (const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vreport_failure (fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
  close_all_handles ();
  exit (1);
}

/* Like fail, appending the libnbd error of the last call. */
void
nbd_fail (const char *fmt, ...)
{
  va_list ap;
  int err = nbd_get_errno ();
  const char *msg = nbd_get_error ();

  va_start (ap, fmt);
  vreport_failure (fmt, ap);
  va_end (ap);
  fprintf (stderr, ": %s (errno %d %s)\n",
           msg ? msg : "(no libnbd error)", err, err ? strerror (err) : "");
  close_all_handles ();
  exit (1);
}

const char *
errno_name (int e)
{
  switch (e) {
  case 0: return "0 (success)";
  case EIO: return "EIO";
  case ENOSPC: return "ENOSPC";
  case ENOTSUP: return "ENOTSUP";
  case EINVAL: return "EINVAL";
  case EPERM: return "EPERM";
  case ENOMEM: return "ENOMEM";
  case ESHUTDOWN: return "ESHUTDOWN";
  case EOVERFLOW: return "EOVERFLOW";
  default: return strerror (e);
  }
}

/* ---------------------------------------------------------------- */
/* Numbers, files, random data                                       */

uint64_t
parse_u64 (const char *what, const char *s)
{
  char *end;
  unsigned long long v;

  errno = 0;
  v = strtoull (s, &end, 0);
  if (errno || end == s)
    goto bad;
  switch (*end) {
  case 'k': case 'K': v <<= 10; end++; break;
  case 'm': case 'M': v <<= 20; end++; break;
  case 'g': case 'G': v <<= 30; end++; break;
  default: break;
  }
  if (*end)
    goto bad;
  return v;
 bad:
  fprintf (stderr, "nbd-check: %s: cannot parse number '%s'\n", what, s);
  exit (2);
}

uint8_t *
load_file (const char *path, uint64_t *sizep)
{
  int fd = open (path, O_RDONLY);
  struct stat st;
  uint8_t *buf;
  uint64_t done = 0;

  if (fd == -1 || fstat (fd, &st) == -1) {
    fprintf (stderr, "nbd-check: %s: %m\n", path);
    exit (2);
  }
  buf = malloc (st.st_size ? st.st_size : 1);
  if (!buf) {
    perror ("malloc");
    exit (2);
  }
  while (done < (uint64_t) st.st_size) {
    ssize_t r = read (fd, buf + done, st.st_size - done);
    if (r <= 0) {
      fprintf (stderr, "nbd-check: read %s: %m\n", path);
      exit (2);
    }
    done += r;
  }
  close (fd);
  *sizep = st.st_size;
  return buf;
}

void
save_file (const char *path, const uint8_t *buf, uint64_t size)
{
  int fd = open (path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  uint64_t done = 0;

  if (fd == -1)
    fail ("%s: %m", path);
  while (done < size) {
    ssize_t r = write (fd, buf + done, size - done);
    if (r <= 0)
      fail ("write %s: %m", path);
    done += r;
  }
  if (close (fd) == -1)
    fail ("close %s: %m", path);
}

void *
xmalloc (size_t n)
{
  void *p = malloc (n ? n : 1);
  if (!p) {
    perror ("malloc");
    exit (2);
  }
  return p;
}

void
rnd_fill (uint64_t *s, uint8_t *buf, size_t len)
{
  size_t i;
  uint64_t v = 0;

  for (i = 0; i < len; ++i) {
    if ((i & 7) == 0)
      v = rnd64 (s);
    buf[i] = v & 0xff;
    v >>= 8;
  }
}

uint64_t
seed_init (uint64_t seed)
{
  uint64_t s = seed * UINT64_C (0x9E3779B97F4A7C15) + UINT64_C (0x1234567);
  return s ? s : 1;
}

double
now_s (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---------------------------------------------------------------- */
/* Connections                                                       */

struct nbd_handle *
do_connect (const char *uri, bool strict_align, bool register_handle)
{
  struct nbd_handle *h = nbd_create ();

  if (!h)
    nbd_fail ("nbd_create");
  if (nbd_add_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1)
    nbd_fail ("nbd_add_meta_context");
  if (!strict_align &&
      nbd_set_strict_mode (h, LIBNBD_STRICT_MASK & ~LIBNBD_STRICT_ALIGN) == -1)
    nbd_fail ("nbd_set_strict_mode");
  if (nbd_connect_uri (h, uri) == -1) {
    int err = nbd_get_errno ();
    const char *msg = nbd_get_error ();
    nbd_close (h);
    fail ("connect %s: %s (errno %d)", uri, msg ? msg : "?", err);
  }
  if (register_handle &&
      n_open_handles < sizeof open_handles / sizeof open_handles[0])
    open_handles[n_open_handles++] = h;
  return h;
}

void
do_disconnect (struct nbd_handle *h)
{
  size_t i;

  for (i = 0; i < n_open_handles; ++i)
    if (open_handles[i] == h)
      open_handles[i] = NULL;
  if (nbd_shutdown (h, 0) == -1)
    nbd_fail ("nbd_shutdown");
  nbd_close (h);
}

uint64_t
max_request (struct nbd_handle *h)
{
  int64_t mx = nbd_get_block_size (h, LIBNBD_SIZE_MAXIMUM);
  uint64_t r = MAX_REQUEST;
  if (mx > 0 && (uint64_t) mx < r)
    r = mx;
  return r;
}

/* Read [off, off+len) in pieces no larger than piece. */
int
read_range (struct nbd_handle *h, uint8_t *buf, uint64_t off, uint64_t len,
            uint64_t piece)
{
  while (len > 0) {
    uint64_t n = len < piece ? len : piece;
    if (nbd_pread (h, buf, n, off, 0) == -1)
      return -1;
    buf += n;
    off += n;
    len -= n;
  }
  return 0;
}

int
write_range (struct nbd_handle *h, const uint8_t *buf, uint64_t off,
             uint64_t len, uint64_t piece, uint32_t flags)
{
  while (len > 0) {
    uint64_t n = len < piece ? len : piece;
    if (nbd_pwrite (h, buf, n, off, flags) == -1)
      return -1;
    buf += n;
    off += n;
    len -= n;
  }
  return 0;
}

/* Compare actual with expected for [off, off+len) (both buffers hold
 * exactly that range).  On mismatch print a diagnostic and return false.
 * 'other' (optional, same range) is a buffer the data must not come from,
 * e.g. the origin model when checking the snapshot.
 */
bool
compare_bufs (const char *label, const uint8_t *expected, const uint8_t *actual,
              const uint8_t *other, const char *other_name,
              uint64_t off, uint64_t len)
{
  uint64_t i, first = UINT64_MAX, last = 0, count = 0, from_other = 0;

  if (memcmp (expected, actual, len) == 0)
    return true;
  for (i = 0; i < len; ++i) {
    if (expected[i] != actual[i]) {
      if (first == UINT64_MAX)
        first = i;
      last = i;
      count++;
      if (other && other[i] == actual[i])
        from_other++;
    }
  }
  fprintf (stderr,
           "nbd-check: MISMATCH %s: request [%" PRIu64 ", +%" PRIu64 "): "
           "%" PRIu64 " bytes differ, first at offset %" PRIu64
           " (expected 0x%02x, got 0x%02x), last at offset %" PRIu64 "\n",
           label, off, len, count, off + first, expected[first],
           actual[first], off + last);
  if (other)
    fprintf (stderr,
             "nbd-check:   %" PRIu64 " of the %" PRIu64
             " differing bytes equal the %s\n",
             from_other, count, other_name);
  fprintf (stderr, "nbd-check:   expected:");
  for (i = first; i < len && i < first + 16; ++i)
    fprintf (stderr, " %02x", expected[i]);
  fprintf (stderr, "\nnbd-check:   actual:  ");
  for (i = first; i < len && i < first + 16; ++i)
    fprintf (stderr, " %02x", actual[i]);
  fprintf (stderr, "\n");
  return false;
}

/* Read a range from h and compare it with model+off. */
void
check_range (struct nbd_handle *h, const char *label, const uint8_t *model,
             const uint8_t *other, const char *other_name,
             uint64_t off, uint64_t len, uint64_t piece)
{
  uint8_t *buf;

  if (len == 0)
    return;
  buf = xmalloc (len);
  if (read_range (h, buf, off, len, piece) == -1)
    nbd_fail ("%s: read [%" PRIu64 ", +%" PRIu64 ")", label, off, len);
  if (!compare_bufs (label, model + off, buf, other ? other + off : NULL,
                     other_name, off, len))
    fail ("%s: data mismatch", label);
  free (buf);
}

/* ---------------------------------------------------------------- */
/* list_exports                                                      */

struct list_ctx {
  const char *want;
  char *desc;
  bool found;
};

static int
list_cb (void *opaque, const char *name, const char *desc)
{
  struct list_ctx *c = opaque;

  if (c->want && strcmp (name, c->want) == 0) {
    c->found = true;
    free (c->desc);
    c->desc = strdup (desc);
  }
  return 0;
}

/* Returns a malloc'd description of export 'name', or NULL if the
 * export is not listed. */
char *
export_description (const char *uri, const char *name)
{
  struct nbd_handle *h = nbd_create ();
  struct list_ctx c = { .want = name };
  nbd_list_callback cb = { .callback = list_cb, .user_data = &c };

  if (!h)
    nbd_fail ("nbd_create");
  if (nbd_set_opt_mode (h, true) == -1)
    nbd_fail ("nbd_set_opt_mode");
  if (nbd_connect_uri (h, uri) == -1)
    nbd_fail ("connect (option mode) %s", uri);
  if (nbd_opt_list (h, cb) == -1)
    nbd_fail ("nbd_opt_list %s", uri);
  nbd_opt_abort (h);
  nbd_close (h);
  if (!c.found) {
    free (c.desc);
    return NULL;
  }
  return c.desc;
}

void
expect_status (const char *uri, const char *word)
{
  char *d = export_description (uri, "snapshot");

  if (!d)
    fail ("list_exports on %s does not list 'snapshot'", uri);
  if (!strstr (d, word))
    fail ("snapshot description is '%s', expected it to contain '%s'",
          d, word);
  note ("snapshot description: '%s' (contains '%s': ok)", d, word);
  free (d);
}

/* ---------------------------------------------------------------- */
/* Extents                                                           */



int
extent_cb (void *opaque, const char *metacontext, uint64_t offset,
           uint32_t *entries, size_t nr_entries, int *error)
{
  struct ext_ctx *c = opaque;
  size_t i;

  (void) error;
  if (strcmp (metacontext, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0)
    return 0;
  if (offset != c->next) {
    c->bad = "extent reply starts at a different offset than requested";
    return 0;
  }
  if (nr_entries % 2 != 0 || nr_entries == 0) {
    c->bad = "odd or empty list of extent entries";
    return 0;
  }
  for (i = 0; i < nr_entries; i += 2) {
    uint64_t len = entries[i];
    if (len == 0) {
      c->bad = "zero-length extent";
      return 0;
    }
    if (c->next >= c->size)       /* extent past the end: stop */
      break;
    if (c->next + len > c->size)
      len = c->size - c->next;
    if (c->n == c->cap) {
      c->cap = c->cap ? c->cap * 2 : 256;
      c->v = realloc (c->v, c->cap * sizeof *c->v);
      if (!c->v) {
        perror ("realloc");
        exit (2);
      }
    }
    c->v[c->n++] = (struct extent) { c->next, len, entries[i + 1] };
    c->next += len;
  }
  return 0;
}

/* Collect extents of the whole export; checks they tile [0, size). */
struct ext_ctx
collect_extents (struct nbd_handle *h, const char *label, uint64_t size)
{
  struct ext_ctx c = { .size = size };
  uint64_t off = 0;

  if (nbd_can_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) != 1)
    fail ("%s: base:allocation meta context not negotiated "
          "(extents not supported)", label);
  while (off < size) {
    uint64_t count = size - off;
    nbd_extent_callback cb = { .callback = extent_cb, .user_data = &c };

    if (count > (UINT64_C (1) << 30))
      count = UINT64_C (1) << 30;
    c.next = off;
    if (nbd_block_status (h, count, off, cb, 0) == -1)
      nbd_fail ("%s: block_status [%" PRIu64 ", +%" PRIu64 ")",
                label, off, count);
    if (c.bad)
      fail ("%s: block_status at %" PRIu64 ": %s", label, off, c.bad);
    if (c.next <= off)
      fail ("%s: block_status at %" PRIu64 " made no progress", label, off);
    off = c.next;
  }
  return c;
}

/* Every extent flagged ZERO must read as zeroes in the model. */
void
check_zero_extents (const char *label, const struct ext_ctx *c,
                    const uint8_t *model)
{
  size_t i;
  uint64_t j;

  for (i = 0; i < c->n; ++i) {
    if (!(c->v[i].flags & LIBNBD_STATE_ZERO))
      continue;
    for (j = c->v[i].off; j < c->v[i].off + c->v[i].len; ++j)
      if (model[j] != 0)
        fail ("%s: extent [%" PRIu64 ", +%" PRIu64 ") flags 0x%x claims "
              "zeroes but the data at offset %" PRIu64 " is 0x%02x",
              label, c->v[i].off, c->v[i].len, c->v[i].flags, j, model[j]);
  }
}

/* ---------------------------------------------------------------- */
/* Common options                                                    */


int
parse_opts (int argc, char **argv, struct opts *o)
{
  static const struct option longopts[] = {
    { "chunk", required_argument, NULL, 'c' },
    { "min", required_argument, NULL, 'm' },
    { "pref", required_argument, NULL, 'p' },
    { "aligned", no_argument, NULL, 'a' },
    { "ops", required_argument, NULL, 'n' },
    { "seed", required_argument, NULL, 's' },
    { "expect-origin", required_argument, NULL, 'O' },
    { "expect-snapshot", required_argument, NULL, 'S' },
    { "region", required_argument, NULL, 'r' },
    { "snap-writers", required_argument, NULL, 'w' },
    { "cow-chunks", required_argument, NULL, 'C' },
    { "min-held", required_argument, NULL, 'H' },
    { "verbose", no_argument, NULL, 'v' },
    { NULL, 0, NULL, 0 }
  };
  int c;

  memset (o, 0, sizeof *o);
  o->chunk = 4096;
  o->ops = 1500;
  o->seed = 1;
  o->region = 16 << 20;
  o->cow_chunks = 16;
  optind = 1;
  while ((c = getopt_long (argc, argv, "+", longopts, NULL)) != -1) {
    switch (c) {
    case 'c': o->chunk = parse_u64 ("--chunk", optarg); break;
    case 'm': o->min = parse_u64 ("--min", optarg); o->have_min = true; break;
    case 'p': o->pref = parse_u64 ("--pref", optarg); o->have_pref = true; break;
    case 'a': o->aligned = true; break;
    case 'n': o->ops = parse_u64 ("--ops", optarg); break;
    case 's': o->seed = parse_u64 ("--seed", optarg); break;
    case 'O': o->expect_origin = optarg; break;
    case 'S': o->expect_snapshot = optarg; break;
    case 'r': o->region = parse_u64 ("--region", optarg); break;
    case 'w': o->snap_writers = parse_u64 ("--snap-writers", optarg); break;
    case 'C': o->cow_chunks = parse_u64 ("--cow-chunks", optarg); break;
    case 'H':
      o->min_held = parse_u64 ("--min-held", optarg);
      o->have_min_held = true;
      break;
    case 'v': verbose = true; break;
    default:
      exit (2);
    }
  }
  if (o->chunk == 0 || (o->chunk & (o->chunk - 1)) != 0) {
    fprintf (stderr, "nbd-check: --chunk must be a power of two\n");
    exit (2);
  }
  return optind;
}
