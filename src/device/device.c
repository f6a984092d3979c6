/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the disks the engine reads and writes (see device.h).
 *
 * Choosing a backend, the dispatchers, and what every backend shares:
 * explaining errors, the zeroing fallback, the all-zero scan.  The
 * backends are device-file.c (regular files, block devices) and
 * device-nbd.c; copying between devices is device-copy.c.
 */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <errno.h>

#include "device.h"
#include "snapfg-error.h"

void
device_note_change (const struct snapfg_device *dev)
{
  atomic_fetch_add ((_Atomic uint64_t *) &dev->changes, 1);
}

/* --- errors explained by backends --- */

/* A backend that can say more than the errno about a failed open (the
 * NBD server's refusal, what kind of file it is) records it as the
 * thread's last error (snapfg-error.h), which device_open and
 * device_create clear first: a record with the errno of the failure is
 * then the backend's.
 */
const char *
device_strerror (int r)
{
  const char *msg = snapfg_get_error ();

  if (r < 0 && msg != NULL && snapfg_get_errno () == -r)
    return msg;
  return strerror (-r);
}

/* --- dispatch --- */

#define DEVICE_BACKEND_ENTRY_(ops) &ops,
static const struct device_ops *const backends[] = {
  SNAPFG_DEVICE_BACKENDS (DEVICE_BACKEND_ENTRY_)
};
#undef DEVICE_BACKEND_ENTRY_
#define NR_BACKENDS (sizeof backends / sizeof backends[0])

/* The backend that takes path: the first that claims it. */
static const struct device_ops *
backend_for (const char *path)
{
  for (size_t i = 0; i < NR_BACKENDS; ++i)
    if (backends[i]->claims (path))
      return backends[i];
  return NULL;
}

bool
device_is_uri (const char *path)
{
  for (size_t i = 0; i < NR_BACKENDS; ++i)
    if (backends[i]->uri && backends[i]->claims (path))
      return true;
  return false;
}

const char *
device_noun (const char *path)
{
  const struct device_ops *ops = backend_for (path);

  return ops ? ops->noun : "device";
}

static void
device_reset (struct snapfg_device *dev, bool readonly)
{
  memset (dev, 0, sizeof *dev);
  dev->can_flush = true;
  dev->readonly = readonly;
  atomic_init (&dev->changes, 1);
  atomic_init (&dev->flushed, 0);
}

/* Open or create (create true) dev with the backend that claims path. */
static int
open_with_backend (struct snapfg_device *dev, const char *path,
                   bool readonly, bool create)
{
  const struct device_ops *ops = backend_for (path);
  int r;

  snapfg_clear_error ();
  device_reset (dev, readonly);
  if (ops == NULL)
    return -EINVAL;             /* nothing takes it */
  if (create && ops->create == NULL)
    return -EEXIST;             /* it exists already: open it instead */
  dev->path = strdup (path);
  if (dev->path == NULL)
    return -ENOMEM;
  r = create ? ops->create (dev, path) : ops->open (dev, path, readonly);
  if (r < 0) {
    free (dev->path);
    device_reset (dev, readonly);
    return r;
  }
  dev->ops = ops;
  return 0;
}

int
device_open (struct snapfg_device *dev, const char *path, bool readonly)
{
  return open_with_backend (dev, path, readonly, false);
}

int
device_create (struct snapfg_device *dev, const char *path)
{
  return open_with_backend (dev, path, false, true);
}

int
device_adopt_file (struct snapfg_device *dev, const char *path, int fd)
{
  int r;

  snapfg_clear_error ();
  device_reset (dev, false);
  dev->path = strdup (path);
  if (dev->path == NULL)
    return -ENOMEM;
  r = device_file_init_fd (dev, fd);
  if (r < 0) {
    free (dev->path);
    device_reset (dev, false);
    return r;
  }
  dev->ops = &device_file_ops;
  return 0;
}

void
device_close (struct snapfg_device *dev)
{
  if (dev->ops)
    dev->ops->close (dev);
  dev->ops = NULL;
  dev->priv = NULL;
  free (dev->path);
  dev->path = NULL;
}

bool
device_identity (const struct snapfg_device *dev, struct device_identity *id)
{
  if (dev->ops == NULL || dev->ops->identity == NULL)
    return false;
  return dev->ops->identity (dev, id);
}

bool
device_same (const struct snapfg_device *a, const struct snapfg_device *b)
{
  if (a->ops == NULL || a->ops != b->ops)
    return false;
  return a->ops->same (a, b);
}

bool
device_is_named (const struct snapfg_device *dev, const char *path)
{
  if (dev->ops == NULL || backend_for (path) != dev->ops)
    return false;
  return dev->ops->is_named (dev, path);
}

int
device_lock (const struct snapfg_device *dev, bool exclusive)
{
  if (dev->ops->lock == NULL)
    return 0;                   /* nothing to lock (an NBD export) */
  return dev->ops->lock (dev, exclusive);
}

int
device_pread (const struct snapfg_device *dev, void *buf, size_t count,
              uint64_t offset)
{
  if (count == 0)
    return 0;
  return dev->ops->pread (dev, buf, count, offset);
}

int
device_pwrite (const struct snapfg_device *dev, const void *buf,
               size_t count, uint64_t offset)
{
  int r;

  if (count == 0)
    return 0;
  r = dev->ops->pwrite (dev, buf, count, offset);
  device_note_change (dev);     /* failed too: it may have written some */
  return r;
}

int
device_pwrite_uncached (const struct snapfg_device *dev, const void *buf,
                        size_t count, uint64_t offset)
{
  int r;

  if (dev->ops->pwrite_uncached == NULL)
    return device_pwrite (dev, buf, count, offset);
  if (count == 0)
    return 0;
  r = dev->ops->pwrite_uncached (dev, buf, count, offset);
  device_note_change (dev);
  return r;
}

int
device_flush (const struct snapfg_device *dev)
{
  uint64_t changes = atomic_load (&dev->changes);
  uint64_t flushed;
  int r;

  if (!dev->can_flush)
    return 0;
  /* Every change that returned before this load is covered by the sync
   * below; one counted after it makes the next flush sync again.
   */
  if (changes == atomic_load (&dev->flushed))
    return 0;
  r = dev->ops->flush (dev);
  if (r == 0) {
    flushed = atomic_load (&dev->flushed);
    while (flushed < changes &&
           !atomic_compare_exchange_weak ((_Atomic uint64_t *) &dev->flushed,
                                          &flushed, changes))
      ;
  }
  return r;
}

int
device_punch (const struct snapfg_device *dev, uint64_t count,
              uint64_t offset)
{
  int r;

  if (count == 0)
    return 0;
  if (dev->ops->punch == NULL)
    return -EOPNOTSUPP;
  r = dev->ops->punch (dev, count, offset);
  device_note_change (dev);
  return r;
}

int
device_preallocate (const struct snapfg_device *dev, uint64_t count,
                    uint64_t offset)
{
  int r;

  if (count == 0)
    return 0;
  if (dev->readonly || dev->ops->preallocate == NULL)
    return -EOPNOTSUPP;
  r = dev->ops->preallocate (dev, count, offset);
  device_note_change (dev);
  return r;
}

/* Write zeroes the slow way, in bounded pieces. */
static int
write_zeroes (const struct snapfg_device *dev, uint64_t count,
              uint64_t offset)
{
  const size_t bufsize = count < 1024 * 1024 ? count : 1024 * 1024;
  void *zeroes = calloc (1, bufsize);
  int r = 0;

  if (zeroes == NULL)
    return -ENOMEM;
  while (count > 0 && r == 0) {
    size_t n = count < bufsize ? count : bufsize;
    r = device_pwrite (dev, zeroes, n, offset);
    count -= n;
    offset += n;
  }
  free (zeroes);
  return r;
}

int
device_zero (const struct snapfg_device *dev, uint64_t count,
             uint64_t offset, bool may_trim, bool fast_only)
{
  int r;

  if (count == 0)
    return 0;
  r = dev->ops->zero (dev, count, offset, may_trim, fast_only);
  device_note_change (dev);
  if (r != -EOPNOTSUPP || fast_only)
    return r;
  return write_zeroes (dev, count, offset);
}

int
device_extents (const struct snapfg_device *dev, uint64_t count,
                uint64_t offset, snapfg_extent_fn fn, void *opaque)
{
  if (count == 0)
    return 0;
  if (dev->ops->extents == NULL)
    return fn (opaque, offset, count, 0);   /* no allocation map: data */
  return dev->ops->extents (dev, count, offset, fn, opaque);
}

int
device_current_size (const struct snapfg_device *dev, uint64_t *size)
{
  if (dev->ops->current_size == NULL) {
    *size = dev->size;          /* it cannot change (an NBD export) */
    return 0;
  }
  return dev->ops->current_size (dev, size);
}

int
device_discard_contents (struct snapfg_device *dev, uint64_t used)
{
  int r;

  if (dev->readonly)
    return 0;                   /* nothing was written to it */
  if (used > dev->size && dev->fixed_size)
    used = dev->size;
  if (dev->ops->discard_contents == NULL)
    /* A disk that cannot shrink: zero (trim) what was used, so that it
     * reads as all zero again.
     */
    return device_zero (dev, used, 0, true, false);
  device_note_change (dev);     /* before and after: it may sync itself */
  r = dev->ops->discard_contents (dev, used);
  device_note_change (dev);
  return r;
}

/* device_is_all_zero: read every extent that is not known to be zero. */
struct zero_scan {
  const struct snapfg_device *dev;
  char *buf;
  size_t bufsize;
  int result;                   /* 1 all zero so far, 0 not, -errno */
};

static int
scan_extent (void *opaque, uint64_t offset, uint64_t length, uint32_t type)
{
  struct zero_scan *zs = opaque;

  if (type & SNAPFG_EXTENT_ZERO)
    return 0;
  while (length > 0) {
    size_t n = length < zs->bufsize ? length : zs->bufsize;
    int r = device_pread (zs->dev, zs->buf, n, offset);

    if (r < 0) {
      zs->result = r;
      return r;
    }
    /* buf is zero iff its first byte is and it equals itself shifted. */
    if (zs->buf[0] != 0 || memcmp (zs->buf, zs->buf + 1, n - 1) != 0) {
      zs->result = 0;
      return -ECANCELED;        /* stop: the answer is known */
    }
    offset += n;
    length -= n;
  }
  return 0;
}

int
device_is_all_zero (const struct snapfg_device *dev)
{
  struct zero_scan zs = { .dev = dev, .bufsize = 1024 * 1024, .result = 1 };
  int r;

  if (dev->size == 0)
    return 1;
  zs.buf = malloc (zs.bufsize);
  if (zs.buf == NULL)
    return -ENOMEM;
  r = device_extents (dev, dev->size, 0, scan_extent, &zs);
  if (r < 0 && zs.result == 1)
    /* The allocation map itself failed: read everything. */
    scan_extent (&zs, 0, dev->size, 0);
  free (zs.buf);
  return zs.result;
}
