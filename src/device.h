/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the disks the engine reads and writes (origin and COW store).
 *
 * A device is a regular file, a block device, or an NBD export named by
 * a URI (nbd://, nbd+unix://, and the other forms libnbd accepts; see
 * device-nbd.c).  Every backend implements struct device_ops; the
 * device_* functions below dispatch to it.  Callers read the fields of
 * struct snapfg_device that describe any disk (path, size, fixed_size,
 * can_flush, readonly); the backend-specific ones (fd, is_block, is_nbd,
 * st_*, priv) are the backends' own, except that the store binding
 * (store-binding.c) and the engine read the origin's identity from them
 * (docs/design.md section 9).  All I/O is positioned and
 * every function may be called from many threads at once on one device.
 * Functions return 0 or a negative errno and never log: callers know
 * which disk it was and say so (with device_strerror for the reason an
 * open failed).
 */
#ifndef SNAPFG_DEVICE_H
#define SNAPFG_DEVICE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

struct device_ops;

struct snapfg_device {
  const struct device_ops *ops;  /* the backend; NULL when closed */
  void *priv;                /* backend state (NBD: the connection pool) */
  int fd;                    /* file and block device backends; else -1 */
  char *path;                /* the path or URI it was opened by */
  uint64_t size;             /* current size in bytes */
  bool is_block;             /* a block device */
  bool is_nbd;               /* an NBD export */
  bool fixed_size;           /* the size cannot change (block device, NBD) */
  bool can_flush;            /* false: flush is a no-op (an NBD server
                              * that cannot flush: it has no write cache,
                              * or so it says) */
  bool readonly;
  bool bounded;              /* the origin: a regular file or block device
                              * ending before 'size' (shrunk under us)
                              * fails I/O there with -EIO instead of
                              * reading zeroes or growing the file */
  dev_t st_dev;              /* identity, to refuse cow= == origin= */
  ino_t st_ino;
  dev_t st_rdev;
  atomic_bool no_copy_range; /* file backend: copy_file_range to this
                              * device said "not supported" once; copies
                              * go through a buffer without asking */
};

/* Types reported by device_extents; the values match nbdkit's. */
#define SNAPFG_EXTENT_HOLE 1
#define SNAPFG_EXTENT_ZERO 2

typedef int (*snapfg_extent_fn) (void *opaque, uint64_t offset,
                                 uint64_t length, uint32_t type);

/* Is path an NBD URI (served by the NBD backend) rather than a file? */
extern bool device_is_uri (const char *path);

/* Open an existing file, block device or NBD export.  A writable open of
 * a read-only export fails with -EROFS.
 */
extern int device_open (struct snapfg_device *dev, const char *path,
                        bool readonly);
/* Create a new regular file (O_EXCL: never replaces anything).  An NBD
 * URI always names an export that exists already: -EEXIST.
 */
extern int device_create (struct snapfg_device *dev, const char *path);
extern void device_close (struct snapfg_device *dev);

/* Why did the last device_open or device_create in this thread fail with
 * r?  The backend's own explanation if it left one (for NBD: libnbd's
 * message, e.g. the server's refusal), else strerror (-r).
 */
extern const char *device_strerror (int r);

/* Are a and b the same disk?  (Files: the same inode; block devices: the
 * same device number; NBD exports: the same URI string.)
 */
extern bool device_same (const struct snapfg_device *a,
                         const struct snapfg_device *b);
/* Does path (a file, block device or URI) name the open device dev?
 * A file that does not exist names nothing.
 */
extern bool device_is_named (const struct snapfg_device *dev,
                             const char *path);

extern int device_pread (const struct snapfg_device *dev, void *buf,
                         size_t count, uint64_t offset);
extern int device_pwrite (const struct snapfg_device *dev, const void *buf,
                          size_t count, uint64_t offset);
/* Make every write completed so far durable (a no-op if !can_flush). */
extern int device_flush (const struct snapfg_device *dev);

/* Copy count bytes from src at src_offset to dst at dst_offset: inside
 * the kernel where both backends can and the run is longer than
 * DEVICE_COPY_BUFFER_CACHED, else (or if that fails) through a buffer
 * (see device-copy.c).  On failure *src_failed says whether reading src
 * failed (true) or writing dst (false).
 */
extern int device_copy (const struct snapfg_device *src, uint64_t src_offset,
                        const struct snapfg_device *dst, uint64_t dst_offset,
                        size_t count, bool *src_failed);

/* A buffer of at least len bytes for copying through user space: up to
 * DEVICE_COPY_BUFFER_CACHED bytes the calling thread's own (no
 * allocation), else a new one.  Give it back with
 * device_copy_buffer_release.  NULL if out of memory.
 */
#define DEVICE_COPY_BUFFER_CACHED (64 * 1024)
extern void *device_copy_buffer (size_t len);
extern void device_copy_buffer_release (void *buf);

/* Deallocate (trim).  -EOPNOTSUPP if the device cannot. */
extern int device_punch (const struct snapfg_device *dev,
                         uint64_t count, uint64_t offset);
/* Make a range read as zeroes.  With fast_only, only if that is cheap
 * (no data written): otherwise -EOPNOTSUPP.
 */
extern int device_zero (const struct snapfg_device *dev, uint64_t count,
                        uint64_t offset, bool may_trim, bool fast_only);

/* Report allocation of [offset, offset+count) through fn, in order. */
extern int device_extents (const struct snapfg_device *dev, uint64_t count,
                           uint64_t offset, snapfg_extent_fn fn,
                           void *opaque);

/* Is the whole device zero (holes count as zero)?  1 yes, 0 no, -errno. */
extern int device_is_all_zero (const struct snapfg_device *dev);

/* The device's size now, which for a file may differ from dev->size
 * (the size at open) if something else truncated or extended it.
 */
extern int device_current_size (const struct snapfg_device *dev,
                                uint64_t *size);

/* Set the size of a regular file (-EINVAL for a fixed-size device). */
extern int device_truncate (struct snapfg_device *dev, uint64_t size);

/* Give back what [0, used) holds and leave the device empty or all zero,
 * as a new one would be: a file becomes empty, a block device or an NBD
 * export is zeroed there.  For stores whose contents die with them (the
 * transient store), so that they never need to know the backend.
 */
extern int device_discard_contents (struct snapfg_device *dev,
                                    uint64_t used);

/* --- backends ---
 *
 * open fills in everything in struct snapfg_device but ops, path and the
 * zeroed defaults (fd = -1) that device_open sets first; it may explain a
 * failure with device_set_error.  The I/O entry points have the meaning
 * of the device_* function of the same name; count is never 0 and
 * offset + count never wraps.  zero returns -EOPNOTSUPP when it cannot
 * zero without writing the data (the dispatcher then writes zeroes unless
 * fast_only).  copy is only called with src and dst whose ops have the
 * same copy function, and may be NULL; it returns -EOPNOTSUPP when it
 * cannot copy between these devices (device_copy then copies through a
 * buffer).
 */
struct device_ops {
  const char *name;
  int (*open) (struct snapfg_device *dev, const char *path, bool readonly);
  void (*close) (struct snapfg_device *dev);
  bool (*same) (const struct snapfg_device *a, const struct snapfg_device *b);
  bool (*is_named) (const struct snapfg_device *dev, const char *path);
  int (*pread) (const struct snapfg_device *dev, void *buf, size_t count,
                uint64_t offset);
  int (*pwrite) (const struct snapfg_device *dev, const void *buf,
                 size_t count, uint64_t offset);
  int (*flush) (const struct snapfg_device *dev);
  int (*copy) (const struct snapfg_device *src, uint64_t src_offset,
               const struct snapfg_device *dst, uint64_t dst_offset,
               size_t count);
  int (*punch) (const struct snapfg_device *dev, uint64_t count,
                uint64_t offset);
  int (*zero) (const struct snapfg_device *dev, uint64_t count,
               uint64_t offset, bool may_trim, bool fast_only);
  int (*extents) (const struct snapfg_device *dev, uint64_t count,
                  uint64_t offset, snapfg_extent_fn fn, void *opaque);
  int (*truncate) (struct snapfg_device *dev, uint64_t size);
  int (*discard_contents) (struct snapfg_device *dev, uint64_t used);
};

extern const struct device_ops device_file_ops;   /* device.c */
extern const struct device_ops device_nbd_ops;    /* device-nbd.c */

/* For backends: record why the open in progress fails (printf-style),
 * for device_strerror (r).
 */
extern void device_set_error (int r, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

#endif
