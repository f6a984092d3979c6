/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* nbd-check: libnbd client driver for the snapfg integration tests.
 *
 * Usage: nbd-check SUBCOMMAND [options] args...
 *
 *   semantics [opts] URI_ORIGIN URI_SNAPSHOT ORIGINAL [SEED]
 *       Random writes (aligned, unaligned, chunk-straddling, multi-chunk)
 *       to the origin and the snapshot, trim/zero/fast-zero, flush/FUA,
 *       block size and extents checks, all against an in-memory model.
 *   concurrency [opts] URI_ORIGIN URI_SNAPSHOT ORIGINAL SECONDS WRITERS READERS
 *       Threads with their own connections: writers write the origin,
 *       readers read the snapshot and compare every byte with ORIGINAL.
 *   failure MODE [opts] URI_ORIGIN URI_SNAPSHOT ORIGINAL
 *       MODE is invalid, overflow or overflow-invalid: fill a small COW
 *       store and check EIO (Invalid) or ENOSPC (Overflow) behaviour.
 *   list URI                      print "name<TAB>description" per export
 *   status URI EXPORT             print the description of EXPORT
 *   fill URI OFFSET LENGTH BYTE   write LENGTH bytes of BYTE at OFFSET
 *   compare URI FILE [OFFSET LENGTH]
 *                                 export contents must equal FILE
 *   size URI                      print the export size
 *
 * Options (semantics, concurrency, failure):
 *   --chunk N            chunk size of the server (default 4096)
 *   --min N              expected advertised minimum block size
 *   --pref N             expected advertised preferred block size
 *   --aligned            send only requests aligned to the minimum block
 *                        size (otherwise strict alignment is switched off
 *                        and byte-granular requests are sent as well)
 *   --ops N              number of random writes (semantics)
 *   --seed N             random seed
 *   --expect-origin F    write the expected final origin contents to F
 *   --expect-snapshot F  write the expected final snapshot contents to F
 *   --region N           bytes of the export the concurrency writers use
 *   --snap-writers N     extra threads writing the snapshot (concurrency)
 *   --cow-chunks N       chunks the COW store can hold (failure)
 *   --min-held N         chunks the store must hold before it is full
 *                        (failure; default --cow-chunks)
 *   --verbose
 *
 * Exit status: 0 pass, 1 fail, 2 usage error.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <libnbd.h>

#define MAX_REQUEST (1024 * 1024)

static bool verbose;

/* ---------------------------------------------------------------- */
/* Messages and failure                                              */

static void note (const char *fmt, ...) __attribute__ ((format (printf, 1, 2)));
static void fail (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2), noreturn));
static void nbd_fail (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2), noreturn));

/* Handles opened by the main thread, closed cleanly on failure. */
static struct nbd_handle *open_handles[256];
static size_t n_open_handles;

static void
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

static void
fail (const char *fmt, ...)
{
  va_list ap;

  fflush (stdout);
  va_start (ap, fmt);
  fputs ("nbd-check: FAIL: ", stderr);
  vfprintf (stderr, fmt, ap);
  fputc ('\n', stderr);
  va_end (ap);
  close_all_handles ();
  exit (1);
}

/* Like fail, appending the libnbd error of the last call. */
static void
nbd_fail (const char *fmt, ...)
{
  va_list ap;
  int err = nbd_get_errno ();
  const char *msg = nbd_get_error ();

  fflush (stdout);
  va_start (ap, fmt);
  fputs ("nbd-check: FAIL: ", stderr);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fprintf (stderr, ": %s (errno %d %s)\n",
           msg ? msg : "(no libnbd error)", err, err ? strerror (err) : "");
  close_all_handles ();
  exit (1);
}

static const char *
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

static uint64_t
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

static uint8_t *
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

static void
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

static void *
xmalloc (size_t n)
{
  void *p = malloc (n ? n : 1);
  if (!p) {
    perror ("malloc");
    exit (2);
  }
  return p;
}

/* xorshift64*: small, fast, and reproducible from a seed. */
static inline uint64_t
rnd64 (uint64_t *s)
{
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * UINT64_C (0x2545F4914F6CDD1D);
}

static inline uint64_t
rnd_below (uint64_t *s, uint64_t n)
{
  return n ? rnd64 (s) % n : 0;
}

static void
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

static uint64_t
seed_init (uint64_t seed)
{
  uint64_t s = seed * UINT64_C (0x9E3779B97F4A7C15) + UINT64_C (0x1234567);
  return s ? s : 1;
}

static inline uint64_t
align_down (uint64_t x, uint64_t a)
{
  return x / a * a;
}

static inline uint64_t
align_up (uint64_t x, uint64_t a)
{
  return (x + a - 1) / a * a;
}

static double
now_s (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---------------------------------------------------------------- */
/* Connections                                                       */

static struct nbd_handle *
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

static void
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

static uint64_t
max_request (struct nbd_handle *h)
{
  int64_t mx = nbd_get_block_size (h, LIBNBD_SIZE_MAXIMUM);
  uint64_t r = MAX_REQUEST;
  if (mx > 0 && (uint64_t) mx < r)
    r = mx;
  return r;
}

/* Read [off, off+len) in pieces no larger than piece. */
static int
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

static int
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
static bool
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
static void
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
  bool print;
};

static int
list_cb (void *opaque, const char *name, const char *desc)
{
  struct list_ctx *c = opaque;

  if (c->print)
    printf ("%s\t%s\n", name, desc);
  if (c->want && strcmp (name, c->want) == 0) {
    c->found = true;
    free (c->desc);
    c->desc = strdup (desc);
  }
  return 0;
}

/* Returns a malloc'd description of export 'name', or NULL if the
 * export is not listed.  With print, prints every export. */
static char *
export_description (const char *uri, const char *name, bool print)
{
  struct nbd_handle *h = nbd_create ();
  struct list_ctx c = { .want = name, .print = print };
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
  fflush (stdout);
  if (!c.found) {
    free (c.desc);
    return NULL;
  }
  return c.desc;
}

static void
expect_status (const char *uri, const char *word)
{
  char *d = export_description (uri, "snapshot", false);

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

struct extent {
  uint64_t off, len;
  uint32_t flags;
};

struct ext_ctx {
  uint64_t next;
  uint64_t size;
  struct extent *v;
  size_t n, cap;
  const char *bad;
};

static int
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
static struct ext_ctx
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
static void
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

struct opts {
  uint64_t chunk, min, pref, ops, seed, region, snap_writers;
  uint64_t cow_chunks, min_held;
  bool aligned, have_min, have_pref, have_min_held;
  const char *expect_origin, *expect_snapshot;
};

static int
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

static int
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

static int
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

  fflush (stdout);
  va_start (ap, fmt);
  fputs ("nbd-check: FAIL: ", stderr);
  vfprintf (stderr, fmt, ap);
  fputc ('\n', stderr);
  va_end (ap);
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
  /* Flush last: "every request" includes flush (DESIGN.md section 6). */
  expect_errno (nbd_flush (hs, 0), EIO, "snapshot flush after Invalid");
  free (buf);
}

static int
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

/* ---------------------------------------------------------------- */
/* small helpers for the shell tests                                 */

static int
cmd_list (int argc, char **argv)
{
  char *d;

  if (argc != 2) {
    fprintf (stderr, "usage: nbd-check list URI\n");
    return 2;
  }
  d = export_description (argv[1], NULL, true);
  free (d);
  return 0;
}

static int
cmd_status (int argc, char **argv)
{
  char *d;

  if (argc != 3) {
    fprintf (stderr, "usage: nbd-check status URI EXPORT\n");
    return 2;
  }
  d = export_description (argv[1], argv[2], false);
  if (!d) {
    fprintf (stderr, "nbd-check: export '%s' is not listed\n", argv[2]);
    return 1;
  }
  printf ("%s\n", d);
  free (d);
  return 0;
}

static int
cmd_fill (int argc, char **argv)
{
  struct nbd_handle *h;
  uint64_t off, len, piece;
  uint8_t *buf;

  if (argc != 5) {
    fprintf (stderr, "usage: nbd-check fill URI OFFSET LENGTH BYTE\n");
    return 2;
  }
  off = parse_u64 ("OFFSET", argv[2]);
  len = parse_u64 ("LENGTH", argv[3]);
  h = do_connect (argv[1], true, true);
  piece = max_request (h);
  buf = xmalloc (len);
  memset (buf, (int) parse_u64 ("BYTE", argv[4]), len);
  if (write_range (h, buf, off, len, piece, 0) == -1)
    nbd_fail ("write [%" PRIu64 ", +%" PRIu64 ")", off, len);
  if (nbd_flush (h, 0) == -1)
    nbd_fail ("flush");
  do_disconnect (h);
  free (buf);
  return 0;
}

static int
cmd_compare (int argc, char **argv)
{
  struct nbd_handle *h;
  uint8_t *file;
  uint64_t fsize, off = 0, len;
  int64_t size;

  if (argc != 3 && argc != 5) {
    fprintf (stderr, "usage: nbd-check compare URI FILE [OFFSET LENGTH]\n");
    return 2;
  }
  file = load_file (argv[2], &fsize);
  h = do_connect (argv[1], true, true);
  if ((size = nbd_get_size (h)) == -1)
    nbd_fail ("get_size");
  len = fsize;
  if (argc == 5) {
    off = parse_u64 ("OFFSET", argv[3]);
    len = parse_u64 ("LENGTH", argv[4]);
    if (off + len > fsize)
      fail ("range beyond the end of %s", argv[2]);
  }
  else if ((uint64_t) size != fsize)
    fail ("export size %" PRIi64 " != size of %s (%" PRIu64 ")", size,
          argv[2], fsize);
  check_range (h, argv[1], file, NULL, NULL, off, len, max_request (h));
  do_disconnect (h);
  free (file);
  note ("%s equals %s", argv[1], argv[2]);
  return 0;
}

static int
cmd_size (int argc, char **argv)
{
  struct nbd_handle *h;
  int64_t size;

  if (argc != 2) {
    fprintf (stderr, "usage: nbd-check size URI\n");
    return 2;
  }
  h = do_connect (argv[1], true, true);
  if ((size = nbd_get_size (h)) == -1)
    nbd_fail ("get_size");
  printf ("%" PRIi64 "\n", size);
  do_disconnect (h);
  return 0;
}

int
main (int argc, char **argv)
{
  const char *cmd;

  if (argc < 2) {
    fprintf (stderr, "usage: nbd-check semantics|concurrency|failure|list|"
             "status|fill|compare|size ...\n");
    return 2;
  }
  cmd = argv[1];
  argc--;
  argv++;
  if (strcmp (cmd, "semantics") == 0)
    return cmd_semantics (argc, argv);
  if (strcmp (cmd, "concurrency") == 0)
    return cmd_concurrency (argc, argv);
  if (strcmp (cmd, "failure") == 0)
    return cmd_failure (argc, argv);
  if (strcmp (cmd, "list") == 0)
    return cmd_list (argc, argv);
  if (strcmp (cmd, "status") == 0)
    return cmd_status (argc, argv);
  if (strcmp (cmd, "fill") == 0)
    return cmd_fill (argc, argv);
  if (strcmp (cmd, "compare") == 0)
    return cmd_compare (argc, argv);
  if (strcmp (cmd, "size") == 0)
    return cmd_size (argc, argv);
  fprintf (stderr, "nbd-check: unknown subcommand '%s'\n", cmd);
  return 2;
}
