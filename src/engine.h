/* snapfg: the engine — an origin and point-in-time snapshots of it, with
 * dm-snapshot semantics (see ../shared/DESIGN.md, kept in README.md).
 *
 * All request functions return 0 or a negative errno.  They may be called
 * from any number of threads at once.
 */
#ifndef SNAPFG_ENGINE_H
#define SNAPFG_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"

struct snapfg_engine;
struct snapfg_snapshot;

enum snapfg_locking {
  SNAPFG_LOCKING_STRIPED,     /* a lock per stripe of the exception tables */
  SNAPFG_LOCKING_GLOBAL,      /* one mutex over all exception state */
};

#define SNAPFG_MIN_CHUNK_SIZE 512
#define SNAPFG_MAX_CHUNK_SIZE (1024 * 1024)
#define SNAPFG_DEFAULT_CHUNK_SIZE 4096
#define SNAPFG_DEFAULT_BLOCK_SIZE 512

/* The name of the snapshot given by cow= at start-up. */
#define SNAPFG_STARTUP_SNAPSHOT "snapshot"

struct snapfg_options {
  const char *origin_path;         /* required */
  enum snapfg_locking locking;
  uint32_t block_size;             /* 512 or 4096 */
};

struct snapfg_snapshot_options {
  const char *name;                /* export name */
  const char *cow_path;
  const char *store_type;          /* "transient" or "persistent" */
  uint32_t chunk_size;             /* power of two, 512 .. 1M */
  uint64_t cow_size;               /* 0: default */
};

/* Checks shared by the plugin's parameter parsing and snapfgctl.  They
 * return NULL if the value is fine, else a message saying what is wrong.
 */
extern const char *snapfg_check_chunk_size (int64_t chunk_size);
extern const char *snapfg_check_block_size (int64_t block_size);

/* Open the origin.  Logs an error naming the file on failure. */
extern int snapfg_engine_open (const struct snapfg_options *opts,
                               struct snapfg_engine **ep);
/* Close everything, cleanly (stores are told the shutdown was clean). */
extern void snapfg_engine_close (struct snapfg_engine *e);

/* Take a snapshot of the origin now and add it to the engine.  In-flight
 * origin writes complete first; later ones copy out into it.
 */
extern int snapfg_snapshot_create (struct snapfg_engine *e,
                                   const struct snapfg_snapshot_options *o);

/* Find a snapshot by export name (NULL if none). */
extern struct snapfg_snapshot *snapfg_find_snapshot (struct snapfg_engine *e,
                                                     const char *name);
/* Names of all snapshots, in creation order, for listing exports. */
extern size_t snapfg_snapshot_count (struct snapfg_engine *e);
extern const char *snapfg_snapshot_name (struct snapfg_engine *e, size_t i);

/* Geometry. */
extern uint64_t snapfg_size (struct snapfg_engine *e);
extern uint32_t snapfg_block_size (struct snapfg_engine *e);
/* The preferred I/O size of a view: the chunk size (of the snapshot, or
 * the smallest of all snapshots for the origin), at least the block size.
 */
extern uint32_t snapfg_preferred_size (struct snapfg_engine *e,
                                       struct snapfg_snapshot *s);
extern const char *snapfg_origin_path (struct snapfg_engine *e);

/* The dm-style status line of a snapshot: "Invalid", "Overflow", or
 * "<allocated sectors>/<total sectors> <metadata sectors>".
 */
extern void snapfg_snapshot_status (struct snapfg_snapshot *s,
                                    char *buf, size_t len);
/* "<store type>, chunk <size>, COW <path>". */
extern void snapfg_snapshot_describe (struct snapfg_snapshot *s,
                                      char *buf, size_t len);

/* Request flags. */
#define SNAPFG_REQ_FUA       (1u << 0)  /* durable before replying */
#define SNAPFG_REQ_MAY_TRIM  (1u << 1)  /* zero may deallocate */
#define SNAPFG_REQ_FAST_ZERO (1u << 2)  /* zero only if cheap, else ENOTSUP */
#define SNAPFG_REQ_ONE       (1u << 3)  /* extents: one extent is enough */

/* Requests on the origin view. */
extern int snapfg_origin_pread (struct snapfg_engine *e, void *buf,
                                uint32_t count, uint64_t offset);
extern int snapfg_origin_pwrite (struct snapfg_engine *e, const void *buf,
                                 uint32_t count, uint64_t offset,
                                 unsigned flags);
extern int snapfg_origin_zero (struct snapfg_engine *e, uint32_t count,
                               uint64_t offset, unsigned flags);
extern int snapfg_origin_trim (struct snapfg_engine *e, uint32_t count,
                               uint64_t offset, unsigned flags);
extern int snapfg_origin_extents (struct snapfg_engine *e, uint32_t count,
                                  uint64_t offset, unsigned flags,
                                  snapfg_extent_fn fn, void *opaque);

/* Requests on a snapshot view. */
extern int snapfg_snapshot_pread (struct snapfg_snapshot *s, void *buf,
                                  uint32_t count, uint64_t offset);
extern int snapfg_snapshot_pwrite (struct snapfg_snapshot *s,
                                   const void *buf, uint32_t count,
                                   uint64_t offset, unsigned flags);
extern int snapfg_snapshot_zero (struct snapfg_snapshot *s, uint32_t count,
                                 uint64_t offset, unsigned flags);
extern int snapfg_snapshot_extents (struct snapfg_snapshot *s,
                                    uint32_t count, uint64_t offset,
                                    unsigned flags, snapfg_extent_fn fn,
                                    void *opaque);

/* Flush: every completed write on every view becomes durable (COW data
 * and metadata of every snapshot, then the origin).
 */
extern int snapfg_flush (struct snapfg_engine *e);

#endif
