/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the disks the engine reads and writes (origin and COW store).
 *
 * A device is a regular file, a block device, or an NBD export named by
 * a URI (nbd://, nbd+unix://, and the other forms libnbd accepts; see
 * device-nbd.c).  Every backend implements struct device_ops and is
 * listed once, in SNAPFG_DEVICE_BACKENDS below; the device_* functions
 * dispatch to it, so callers never look at the backend: they read only
 * the fields of struct snapfg_device, which describe any disk, and ask
 * the rest (identity, locking, the current size) through functions
 * here.  Each backend keeps its own state behind priv (docs/design.md
 * section 9).  All I/O is positioned and every function may be called
 * from many threads at once on one device.  Functions return 0 or a
 * negative errno and never log: callers know which disk it was and say
 * so (with device_strerror for the reason an open failed).
 */
#ifndef SNAPFG_DEVICE_H
#define SNAPFG_DEVICE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

struct device_ops;

struct snapfg_device {
  const struct device_ops *ops;  /* the backend; NULL when closed */
  void *priv;                /* the backend's own state */
  char *path;                /* the path or URI it was opened by */
  uint64_t size;             /* current size in bytes */
  bool fixed_size;           /* the size cannot change (block device, NBD) */
  bool can_flush;            /* false: flush is a no-op (an NBD server
                              * that cannot flush: it has no write cache,
                              * or so it says) */
  bool readonly;
  bool bounded;              /* set by the opener (the engine, for the
                              * origin): a disk that ends before 'size'
                              * (shrunk under us) fails I/O there with
                              * -EIO instead of reading zeroes or growing
                              * the file */
  /* Changes made through this handle (writes, zeroes, trims, copies,
   * preallocation; counted once each returns), and how many of them the
   * last successful flush covered: a flush with nothing changed since
   * is skipped (on ext4 even a clean file's sync costs a flush of the
   * disk's cache).  1 at open, so that the first flush covers whatever
   * an earlier process left in the page cache.  Changed through the
   * const handles the I/O functions take: they count, they describe
   * nothing.  Every file is written through one handle.
   */
  _Atomic uint64_t changes, flushed;
};

/* A change through dev has returned, for the backends' own writes (see
 * the struct: the flush skips a device with no change since the last).
 */
extern void device_note_change (const struct snapfg_device *dev);

/* Types reported by device_extents; the values match nbdkit's. */
#define SNAPFG_EXTENT_HOLE 1
#define SNAPFG_EXTENT_ZERO 2

typedef int (*snapfg_extent_fn) (void *opaque, uint64_t offset,
                                 uint64_t length, uint32_t type);

/* Is path a URI (an NBD export, or whatever else a backend names by a
 * URI) rather than a path in the file system?  URIs are kept exactly as
 * given: never made absolute, resolved or looked up.
 */
extern bool device_is_uri (const char *path);

/* What path names, for messages: "file", "block device", "export". */
extern const char *device_noun (const char *path);

/* Open an existing file, block device or NBD export.  A writable open of
 * a read-only export fails with -EROFS.
 */
extern int device_open (struct snapfg_device *dev, const char *path,
                        bool readonly);
/* Create a new regular file (O_EXCL: never replaces anything).  A path
 * no backend can create (an NBD export, a block device) names a disk
 * that exists already: -EEXIST.
 */
extern int device_create (struct snapfg_device *dev, const char *path);
/* Take over fd, a regular file open read-write that the caller opened
 * itself (e.g. through a directory descriptor), as a file device called
 * path.  On failure fd is not closed.
 */
extern int device_adopt_file (struct snapfg_device *dev, const char *path,
                              int fd);
extern void device_close (struct snapfg_device *dev);

/* Why did the last device_open or device_create in this thread fail with
 * r?  The backend's own explanation if it left one (for NBD: libnbd's
 * message, e.g. the server's refusal), else strerror (-r).  Backends
 * record theirs with snapfg_set_error (common/snapfg-error.h) during
 * the open, which starts with a clear record.
 */
extern const char *device_strerror (int r);

/* What identifies a disk on this machine beyond its path, for records
 * that must recognise it after a rename or a restart (the store
 * binding): a regular file's device and inode numbers, a block device's
 * device number (in ino; dev is 0).
 */
struct device_identity {
  uint64_t dev;
  uint64_t ino;
};
/* Fill in *id; false if the disk has no such identity (an NBD export is
 * known by its URI alone).
 */
extern bool device_identity (const struct snapfg_device *dev,
                             struct device_identity *id);

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

/* Lock the disk against other users for as long as it is open: an
 * exclusive lock, or a shared one that only keeps writers out.  -EAGAIN
 * if someone holds a lock that conflicts (another snapfg server, or a
 * program such as QEMU that locks its images).  0 for a disk that
 * cannot be locked (an NBD export).
 */
extern int device_lock (const struct snapfg_device *dev, bool exclusive);

extern int device_pread (const struct snapfg_device *dev, void *buf,
                         size_t count, uint64_t offset);
extern int device_pwrite (const struct snapfg_device *dev, const void *buf,
                          size_t count, uint64_t offset);
/* A large write of data that nothing reads back soon (the committer's
 * copies into a COW store), from a buffer aligned to DEVICE_UNCACHED_ALIGN:
 * past the page cache where the device can (O_DIRECT), else a pwrite.
 */
#define DEVICE_UNCACHED_ALIGN 4096
extern int device_pwrite_uncached (const struct snapfg_device *dev,
                                   const void *buf, size_t count,
                                   uint64_t offset);
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
/* Reserve the blocks of [offset, offset+count) of a file that grows
 * (fallocate with the size kept): later writes there need no block
 * allocation.  -EOPNOTSUPP where that means nothing (a disk of fixed
 * size) or the file system cannot.
 */
extern int device_preallocate (const struct snapfg_device *dev,
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

/* Give back what [0, used) holds and leave the device empty or all zero,
 * as a new one would be: a file becomes empty, a block device or an NBD
 * export is zeroed there.  For stores whose contents die with them (the
 * transient store), so that they never need to know the backend.
 */
extern int device_discard_contents (struct snapfg_device *dev,
                                    uint64_t used);

/* --- backends ---
 *
 * claims says whether a path or URI is this backend's; device_open and
 * device_create ask the backends in SNAPFG_DEVICE_BACKENDS order and use
 * the first that claims it.  uri says the backend's names are URIs, not
 * paths (device_is_uri).  open (and create, NULL if the backend cannot
 * create: the disk must exist) fills in priv, size, fixed_size and
 * can_flush if it is false; device_open has set the rest (path,
 * readonly; ops once open succeeds).  Either may explain a failure with
 * snapfg_set_error.  These may be NULL: identity (none), lock (nothing
 * to lock), current_size (a fixed size), punch (cannot
 * trim), extents (no allocation map: all data), discard_contents (zero
 * what was used).  The I/O entry
 * points have the meaning of the device_* function of the same name;
 * count is never 0 and offset + count never wraps.  zero returns
 * -EOPNOTSUPP when it cannot zero without writing the data (the
 * dispatcher then writes zeroes unless fast_only).  copy (NULL: never in
 * the kernel) is only called when src and dst have the same copy
 * function; any failure makes the dispatcher copy through a buffer.
 * discard_contents is not called for a read-only device, and gets used
 * <= size for a fixed-size one.
 */
struct device_ops {
  const char *name;
  const char *noun;             /* for messages: "file", "export" */
  bool uri;
  bool (*claims) (const char *path);
  int (*open) (struct snapfg_device *dev, const char *path, bool readonly);
  int (*create) (struct snapfg_device *dev, const char *path);
  void (*close) (struct snapfg_device *dev);
  bool (*identity) (const struct snapfg_device *dev,
                    struct device_identity *id);
  bool (*same) (const struct snapfg_device *a, const struct snapfg_device *b);
  bool (*is_named) (const struct snapfg_device *dev, const char *path);
  int (*lock) (const struct snapfg_device *dev, bool exclusive);
  int (*current_size) (const struct snapfg_device *dev, uint64_t *size);
  int (*pread) (const struct snapfg_device *dev, void *buf, size_t count,
                uint64_t offset);
  int (*pwrite) (const struct snapfg_device *dev, const void *buf,
                 size_t count, uint64_t offset);
  /* Optional: as pwrite, for data not read back soon (NULL: pwrite). */
  int (*pwrite_uncached) (const struct snapfg_device *dev, const void *buf,
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
  int (*discard_contents) (struct snapfg_device *dev, uint64_t used);
  /* Reserve the blocks of [offset, offset+count) without writing them
   * or changing the size (NULL: cannot).
   */
  int (*preallocate) (const struct snapfg_device *dev, uint64_t count,
                      uint64_t offset);
};

/* The backends, listed once, in the order device_open asks them: those
 * that recognise their names by their form first, the file backend
 * last (it takes whatever is left, and its open says if that is not a
 * regular file).  Adding a backend: a file of its own defining a struct
 * device_ops, one line here, and the file in Makefile.am.
 */
#define SNAPFG_DEVICE_BACKENDS(X)                                        \
  X (device_nbd_ops)            /* device-nbd.c: NBD URIs */             \
  X (device_block_ops)          /* device-file.c: block devices */       \
  X (device_file_ops)           /* device-file.c: regular files */

#define DEVICE_BACKEND_DECLARE_(ops) extern const struct device_ops ops;
SNAPFG_DEVICE_BACKENDS (DEVICE_BACKEND_DECLARE_)
#undef DEVICE_BACKEND_DECLARE_

/* device-file.c, for device_adopt_file: set dev up around fd, a
 * regular file (-EINVAL, fd untouched, if it is not one).
 */
extern int device_file_init_fd (struct snapfg_device *dev, int fd);

#endif
