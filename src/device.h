/* snapfg: the disks the engine reads and writes (origin and COW store).
 *
 * A device is a regular file or a block device.  All I/O is positioned
 * (pread/pwrite), so one descriptor serves every thread.  Functions return
 * 0 or a negative errno and never log: callers know which disk it was and
 * say so.
 */
#ifndef SNAPFG_DEVICE_H
#define SNAPFG_DEVICE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct snapfg_device {
  int fd;
  char *path;
  uint64_t size;             /* current size in bytes */
  bool is_block;             /* a block device (else a regular file) */
  bool readonly;
  dev_t st_dev;              /* identity, to refuse cow= == origin= */
  ino_t st_ino;
  dev_t st_rdev;
};

/* Types reported by device_extents; the values match nbdkit's. */
#define SNAPFG_EXTENT_HOLE 1
#define SNAPFG_EXTENT_ZERO 2

typedef int (*snapfg_extent_fn) (void *opaque, uint64_t offset,
                                 uint64_t length, uint32_t type);

/* Open an existing file or block device. */
extern int device_open (struct snapfg_device *dev, const char *path,
                        bool readonly);
/* Create a new regular file (O_EXCL: never replaces anything). */
extern int device_create (struct snapfg_device *dev, const char *path);
extern void device_close (struct snapfg_device *dev);

extern bool device_same (const struct snapfg_device *a,
                         const struct snapfg_device *b);

extern int device_pread (const struct snapfg_device *dev, void *buf,
                         size_t count, uint64_t offset);
extern int device_pwrite (const struct snapfg_device *dev, const void *buf,
                          size_t count, uint64_t offset);
extern int device_flush (const struct snapfg_device *dev);

/* Copy count bytes from src at src_offset to dst at dst_offset inside the
 * kernel (copy_file_range: one system call, no user-space copy).
 * -EOPNOTSUPP if these devices cannot: the caller copies by hand.
 */
extern int device_copy (const struct snapfg_device *src, uint64_t src_offset,
                        const struct snapfg_device *dst, uint64_t dst_offset,
                        size_t count);

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

/* Set the size of a regular file. */
extern int device_truncate (struct snapfg_device *dev, uint64_t size);

#endif
