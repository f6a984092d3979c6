/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the NBD backend (see device.h): an origin or COW store served
 * by an NBD server and named by a URI, e.g.
 *
 *   nbd://host[:port]/export
 *   nbd+unix:///export?socket=/path/to/socket
 *
 * (any URI libnbd's nbd_connect_uri accepts).
 *
 * Connection pool.  libnbd's synchronous calls hold a handle for the
 * whole request, so one handle would serialise every request.  The
 * device keeps a pool of connections (SNAPFG_NBD_CONNECTIONS, default 4)
 * and each request takes an idle one, does its synchronous call and puts
 * it back.  The pool's mutex is only held to take or return a handle,
 * never during I/O; a request that finds none idle waits on a condition
 * variable.
 *
 * Several connections are only used when the server advertises
 * multi-conn: then a flush on any connection covers the writes completed
 * on all of them, and every connection sees the others' completed writes.
 * Without it the NBD protocol promises neither, so the pool has one
 * connection (correct ordering matters more than parallelism: the
 * persistent store's flush of the COW data and metadata must cover
 * writes made on any connection before the origin is overwritten).
 *
 * A connection that breaks leaves the pool and is not reopened: writes
 * acknowledged but not flushed on it may be gone with a restarted
 * server, and a flush on a new connection would then claim durability
 * for them.  The request that found it broken fails with EIO, which the
 * engine handles like any I/O error (the snapshot becomes Invalid, or the
 * client gets the error); the others carry on with the connections left,
 * and once none is left every request fails with EIO at once.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>

#include <libnbd.h>

#include "device.h"
#include "snapfg-error.h"
#include "rounding.h"
#include "vector.h"

#define DEFAULT_CONNECTIONS 4
#define MAX_CONNECTIONS 64

/* The largest pread or pwrite sent at once (libnbd refuses more than
 * 64M; the server may advertise less).
 */
#define MAX_IO (32 * 1024 * 1024)
/* The largest zero, trim or block status request (lengths are 32-bit
 * on the wire).
 */
#define MAX_CMD (1024 * 1024 * 1024)

struct nbd_pool {
  pthread_mutex_t lock;
  pthread_cond_t available;
  struct nbd_handle **conns;      /* every connection */
  size_t nconns;
  struct nbd_handle **idle;       /* stack of idle connections */
  size_t nidle;
  size_t nlive;                   /* connections not found broken */
  uint32_t max_io;                /* largest pread/pwrite */
  bool can_trim;
  bool can_zero;
  bool can_fast_zero;
  bool can_extents;               /* base:allocation was negotiated */
};

static struct nbd_pool *
pool_of (const struct snapfg_device *dev)
{
  return dev->priv;
}

/* Take an idle connection, waiting for one if need be; NULL if every
 * connection is broken.
 */
static struct nbd_handle *
pool_get (struct nbd_pool *p)
{
  struct nbd_handle *h = NULL;

  pthread_mutex_lock (&p->lock);
  while (p->nidle == 0 && p->nlive > 0)
    pthread_cond_wait (&p->available, &p->lock);
  if (p->nidle > 0)
    h = p->idle[--p->nidle];
  pthread_mutex_unlock (&p->lock);
  return h;
}

static bool
is_broken (struct nbd_handle *h)
{
  return nbd_aio_is_dead (h) == 1 || nbd_aio_is_closed (h) == 1;
}

/* Give a connection back; a broken one leaves the pool (it is closed
 * with the others when the device closes).
 */
static void
pool_put (struct nbd_pool *p, struct nbd_handle *h)
{
  bool broken = is_broken (h);

  pthread_mutex_lock (&p->lock);
  if (broken) {
    p->nlive--;
    /* Waiters must see that none may be left. */
    pthread_cond_broadcast (&p->available);
  }
  else {
    p->idle[p->nidle++] = h;
    pthread_cond_signal (&p->available);
  }
  pthread_mutex_unlock (&p->lock);
}

/* The negative errno for the last failed libnbd call on h in this
 * thread.  A broken connection is an I/O error (libnbd says ENOTCONN,
 * or EINVAL for calls on a dead handle, which nbdkit would pass on to
 * clients as a bad request).
 */
static int
nbd_failure (struct nbd_handle *h)
{
  int err = nbd_get_errno ();

  if (is_broken (h) || err == ENOTCONN || err == ECONNRESET || err == EPIPE)
    return -EIO;
  return err > 0 ? -err : -EIO;
}

/* The negative errno of the last failed libnbd call in this thread. */
static int
nbd_result (void)
{
  int err = nbd_get_errno ();

  return err > 0 ? -err : -EIO;
}

static bool
is_unsupported (int r)
{
  return r == -EOPNOTSUPP || r == -ENOTSUP;
}

static size_t
pool_size (void)
{
  const char *env = getenv ("SNAPFG_NBD_CONNECTIONS");
  long n;

  if (env == NULL || *env == '\0')
    return DEFAULT_CONNECTIONS;
  n = strtol (env, NULL, 10);
  if (n < 1)
    return 1;
  if (n > MAX_CONNECTIONS)
    return MAX_CONNECTIONS;
  return n;
}

/* Open one connection; on failure explain it and return NULL with *rp
 * set.
 */
static struct nbd_handle *
connect_one (const char *uri, int *rp)
{
  struct nbd_handle *h;

  h = nbd_create ();
  if (h == NULL) {
    *rp = nbd_result ();
    snapfg_set_error (-*rp, "cannot create a libnbd handle: %s",
                      nbd_get_error ());
    return NULL;
  }
  if (nbd_add_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1 ||
      nbd_connect_uri (h, uri) == -1) {
    *rp = nbd_result ();
    snapfg_set_error (-*rp, "cannot connect to the NBD server: %s",
                      nbd_get_error ());
    nbd_close (h);
    return NULL;
  }
  return h;
}

static void
disconnect (struct nbd_handle *h)
{
  /* A clean NBD_CMD_DISC; nothing is in flight (every call is
   * synchronous and has returned).
   */
  nbd_shutdown (h, 0);
  nbd_close (h);
}

static void
pool_free (struct nbd_pool *p)
{
  for (size_t i = 0; i < p->nconns; ++i)
    disconnect (p->conns[i]);
  pthread_cond_destroy (&p->available);
  pthread_mutex_destroy (&p->lock);
  free (p->conns);
  free (p->idle);
  free (p);
}

static int
nbd_dev_open (struct snapfg_device *dev, const char *uri, bool readonly)
{
  struct nbd_pool *p;
  struct nbd_handle *h;
  size_t want;
  int64_t size, min_block, max_block;
  int r;

  p = calloc (1, sizeof *p);
  if (p == NULL)
    return -ENOMEM;
  pthread_mutex_init (&p->lock, NULL);
  pthread_cond_init (&p->available, NULL);
  want = pool_size ();
  p->conns = calloc (want, sizeof *p->conns);
  p->idle = calloc (want, sizeof *p->idle);
  if (p->conns == NULL || p->idle == NULL) {
    r = -ENOMEM;
    goto err;
  }

  /* The first connection tells what the export is and can do. */
  h = connect_one (uri, &r);
  if (h == NULL)
    goto err;
  p->conns[p->nconns++] = h;

  size = nbd_get_size (h);
  if (size < 0) {
    r = nbd_result ();
    snapfg_set_error (-r, "cannot get the export's size: %s",
                      nbd_get_error ());
    goto err;
  }
  if (!readonly && nbd_is_read_only (h) == 1) {
    r = -EROFS;
    snapfg_set_error (-r, "the NBD server exports it read-only");
    goto err;
  }
  min_block = nbd_get_block_size (h, LIBNBD_SIZE_MINIMUM);
  if (min_block > 512) {
    r = -EINVAL;
    snapfg_set_error (-r, "the NBD server's minimum block size is %" PRIi64
                      " bytes; snapfg needs a server that accepts 512-byte "
                      "requests", min_block);
    goto err;
  }
  max_block = nbd_get_block_size (h, LIBNBD_SIZE_MAXIMUM);
  p->max_io = MAX_IO;
  if (max_block > 0 && max_block < MAX_IO) {
    /* Keep pieces a multiple of 512 (the engine's alignment). */
    p->max_io = round_down (max_block, 512);
    if (p->max_io == 0) {
      r = -EINVAL;
      snapfg_set_error (-r, "the NBD server's maximum block size is %" PRIi64
                        " bytes; snapfg needs at least 512", max_block);
      goto err;
    }
  }
  p->can_trim = nbd_can_trim (h) == 1;
  p->can_zero = nbd_can_zero (h) == 1;
  p->can_fast_zero = p->can_zero && nbd_can_fast_zero (h) == 1;
  p->can_extents =
    nbd_can_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
  dev->can_flush = nbd_can_flush (h) == 1;

  /* Only a multi-conn server keeps several connections consistent. */
  if (nbd_can_multi_conn (h) != 1)
    want = 1;
  while (p->nconns < want) {
    h = connect_one (uri, &r);
    if (h == NULL)
      goto err;
    p->conns[p->nconns++] = h;
    if (nbd_get_size (h) != size) {
      r = -EIO;
      snapfg_set_error (-r, "the export's size changed between connections");
      goto err;
    }
  }
  for (size_t i = 0; i < p->nconns; ++i)
    p->idle[p->nidle++] = p->conns[i];
  p->nlive = p->nconns;

  dev->priv = p;
  dev->size = size;
  dev->fixed_size = true;
  return 0;

 err:
  pool_free (p);
  return r;
}

/* nbd[s][+unix|+vsock]:// */
static bool
nbd_dev_claims (const char *path)
{
  if (strncmp (path, "nbd", 3) != 0)
    return false;
  path += 3;
  if (*path == 's')
    path++;
  if (strncmp (path, "+unix", 5) == 0)
    path += 5;
  else if (strncmp (path, "+vsock", 6) == 0)
    path += 6;
  return strncmp (path, "://", 3) == 0;
}

static void
nbd_dev_close (struct snapfg_device *dev)
{
  if (dev->priv)
    pool_free (dev->priv);
}

static bool
nbd_dev_same (const struct snapfg_device *a, const struct snapfg_device *b)
{
  return strcmp (a->path, b->path) == 0;
}

static bool
nbd_dev_is_named (const struct snapfg_device *dev, const char *uri)
{
  return strcmp (dev->path, uri) == 0;
}

/* The requests in_pieces sends. */
enum piece_op {
  PIECE_PREAD, PIECE_PWRITE, PIECE_TRIM, PIECE_ZERO, PIECE_FLUSH,
};

static int
send_piece (struct nbd_handle *h, enum piece_op op, char *buf,
            uint64_t count, uint64_t offset, uint32_t flags)
{
  switch (op) {
  case PIECE_PREAD: return nbd_pread (h, buf, count, offset, flags);
  case PIECE_PWRITE: return nbd_pwrite (h, buf, count, offset, flags);
  case PIECE_TRIM: return nbd_trim (h, count, offset, flags);
  case PIECE_ZERO: return nbd_zero (h, count, offset, flags);
  case PIECE_FLUSH: return nbd_flush (h, flags);
  }
  abort ();
}

/* Send a request as pieces of at most max bytes, one after the other on
 * one connection.  buf (NULL for requests that carry no data) moves on
 * with the offset.  A piece the server does not support fails the
 * request with -EOPNOTSUPP.  (count is 0 only for a flush, sent once.)
 */
static int
in_pieces (const struct snapfg_device *dev, enum piece_op op, char *buf,
           uint64_t count, uint64_t offset, uint64_t max, uint32_t flags)
{
  struct nbd_pool *p = pool_of (dev);
  struct nbd_handle *h;
  int r = 0;

  h = pool_get (p);
  if (h == NULL)
    return -EIO;                /* every connection is broken */
  do {
    uint64_t n = count < max ? count : max;

    if (send_piece (h, op, buf, n, offset, flags) == -1) {
      r = nbd_failure (h);
      if (is_unsupported (r))
        r = -EOPNOTSUPP;
      break;
    }
    if (buf)
      buf += n;
    offset += n;
    count -= n;
  } while (count > 0);
  pool_put (p, h);
  return r;
}

static int
nbd_dev_pread (const struct snapfg_device *dev, void *buf, size_t count,
               uint64_t offset)
{
  char *ptr = buf;

  /* Past the end reads as zeroes, as it does for a file. */
  if (offset >= dev->size) {
    memset (buf, 0, count);
    return 0;
  }
  if (count > dev->size - offset) {
    memset (ptr + (dev->size - offset), 0, count - (dev->size - offset));
    count = dev->size - offset;
  }
  return in_pieces (dev, PIECE_PREAD, ptr, count, offset,
                    pool_of (dev)->max_io, 0);
}

static int
nbd_dev_pwrite (const struct snapfg_device *dev, const void *buf,
                size_t count, uint64_t offset)
{
  if (offset > dev->size || count > dev->size - offset)
    return -ENOSPC;             /* as a write past a block device's end */
  /* (nbd_pwrite only reads buf.) */
  return in_pieces (dev, PIECE_PWRITE, (char *) buf, count, offset,
                    pool_of (dev)->max_io, 0);
}

static int
nbd_dev_flush (const struct snapfg_device *dev)
{
  /* One connection: either it is the only one, or the server is
   * multi-conn and its flush covers every connection.
   */
  return in_pieces (dev, PIECE_FLUSH, NULL, 0, 0, 0, 0);
}

static int
nbd_dev_punch (const struct snapfg_device *dev, uint64_t count,
               uint64_t offset)
{
  if (!pool_of (dev)->can_trim)
    return -EOPNOTSUPP;
  if (offset > dev->size || count > dev->size - offset)
    return -EINVAL;
  return in_pieces (dev, PIECE_TRIM, NULL, count, offset, MAX_CMD, 0);
}

static int
nbd_dev_zero (const struct snapfg_device *dev, uint64_t count,
              uint64_t offset, bool may_trim, bool fast_only)
{
  struct nbd_pool *p = pool_of (dev);
  uint32_t flags = 0;

  if (!p->can_zero || (fast_only && !p->can_fast_zero))
    return -EOPNOTSUPP;         /* the dispatcher writes zeroes if it may */
  if (offset > dev->size || count > dev->size - offset)
    return -ENOSPC;
  if (!may_trim)
    flags |= LIBNBD_CMD_FLAG_NO_HOLE;
  if (fast_only)
    flags |= LIBNBD_CMD_FLAG_FAST_ZERO;
  return in_pieces (dev, PIECE_ZERO, NULL, count, offset, MAX_CMD, flags);
}

/* Extents are gathered while the connection is held and reported after
 * it is returned: the caller's function may do I/O on this device (and
 * with one connection would otherwise wait for itself).
 */
struct extent { uint64_t length; uint32_t type; };
DEFINE_VECTOR_TYPE (extent_vector, struct extent);

struct extent_list {
  uint64_t offset;                /* where the next extent starts */
  uint64_t end;                   /* end of the request */
  extent_vector v;
  bool seen;                      /* the base:allocation reply came */
};

static int
gather_extents (void *opaque, const char *context, uint64_t offset,
                uint32_t *entries, size_t nr_entries, int *error)
{
  struct extent_list *l = opaque;

  if (strcmp (context, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0 || l->seen)
    return 0;                   /* another context, or a repeat: ignore */
  l->seen = true;
  for (size_t i = 0; i + 1 < nr_entries && l->offset < l->end; i += 2) {
    uint64_t length = entries[i];

    if (length == 0)
      break;
    if (length > l->end - l->offset)
      length = l->end - l->offset;
    struct extent e = {
      .length = length,
      .type = entries[i + 1] & (SNAPFG_EXTENT_HOLE | SNAPFG_EXTENT_ZERO),
    };
    int r = extent_vector_append (&l->v, e);
    if (r < 0) {
      *error = -r;
      return -1;
    }
    l->offset += length;
  }
  return 0;
}

static int
nbd_dev_extents (const struct snapfg_device *dev, uint64_t count,
                 uint64_t offset, snapfg_extent_fn fn, void *opaque)
{
  struct nbd_pool *p = pool_of (dev);
  struct extent_list l = { .offset = 0 };
  uint64_t end = offset + count;
  int r = 0;

  if (!p->can_extents)
    return fn (opaque, offset, count, 0);

  while (offset < end && r == 0) {
    uint64_t piece_end;
    struct nbd_handle *h;

    if (offset >= dev->size) {
      /* Past the end reads as zeroes. */
      r = fn (opaque, offset, end - offset,
              SNAPFG_EXTENT_HOLE | SNAPFG_EXTENT_ZERO);
      break;
    }
    piece_end = end < dev->size ? end : dev->size;
    if (piece_end - offset > MAX_CMD)
      piece_end = offset + MAX_CMD;

    l.offset = offset;
    l.end = piece_end;
    extent_vector_clear (&l.v);
    l.seen = false;
    h = pool_get (p);
    if (h == NULL) {
      r = -EIO;                 /* every connection is broken */
      break;
    }
    if (nbd_block_status (h, piece_end - offset, offset,
                          (nbd_extent_callback) {
                            .callback = gather_extents, .user_data = &l },
                          0) == -1)
      r = nbd_failure (h);
    pool_put (p, h);
    if (r < 0)
      break;

    for (size_t i = 0; i < l.v.len && r == 0; ++i) {
      r = fn (opaque, offset, l.v.ptr[i].length, l.v.ptr[i].type);
      offset += l.v.ptr[i].length;
    }
    if (r == 0 && l.v.len == 0) {
      /* The server said nothing useful: call the piece data. */
      r = fn (opaque, offset, piece_end - offset, 0);
      offset = piece_end;
    }
  }
  extent_vector_reset (&l.v);
  return r;
}

const struct device_ops device_nbd_ops = {
  .name = "nbd",
  .noun = "export",
  .uri = true,
  .claims = nbd_dev_claims,
  .open = nbd_dev_open,
  .create = NULL,               /* an export exists: it is opened */
  .close = nbd_dev_close,
  .identity = NULL,             /* known by its URI alone */
  .same = nbd_dev_same,
  .is_named = nbd_dev_is_named,
  .lock = NULL,                 /* an export cannot be locked */
  .current_size = NULL,         /* an export's size is fixed */
  .pread = nbd_dev_pread,
  .pwrite = nbd_dev_pwrite,
  .flush = nbd_dev_flush,
  .copy = NULL,                 /* device_copy copies through a buffer */
  .punch = nbd_dev_punch,
  .zero = nbd_dev_zero,
  .extents = nbd_dev_extents,
  .discard_contents = NULL,     /* zeroes (trims) what was used */
};
