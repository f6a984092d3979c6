/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the engine — an origin and point-in-time snapshots of it, with
 * dm-snapshot semantics (see docs/design.md).
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
#include "stats.h"
#include "chunk-size.h"         /* SNAPFG_{MIN,MAX}_CHUNK_SIZE, snapfg_check_chunk_size */
#include "snapshot-name.h"      /* snapfg_check_snapshot_name, SNAPFG_STARTUP_SNAPSHOT */

struct snapfg_engine;
struct snapfg_snapshot;

enum snapfg_locking {
  SNAPFG_LOCKING_STRIPED,     /* a lock per stripe of the exception tables */
  SNAPFG_LOCKING_GLOBAL,      /* one mutex over all exception state */
};

#define SNAPFG_DEFAULT_CHUNK_SIZE 4096
#define SNAPFG_DEFAULT_BLOCK_SIZE 512


/* When the persistent store's commits are durable (durability=). */
enum snapfg_durability {
  SNAPFG_DURABILITY_SYNC,     /* every exception durable before its origin write */
  SNAPFG_DURABILITY_FLUSH,    /* ordered, made durable at client flush/FUA */
};

/* max-snapshots= default: each snapshot costs memory and every first
 * write to an origin chunk copies into each.
 */
#define SNAPFG_DEFAULT_MAX_SNAPSHOTS 32

struct snapfg_options {
  const char *origin_path;         /* required */
  enum snapfg_locking locking;
  enum snapfg_durability durability;
  uint32_t block_size;             /* 512 or 4096 */
  unsigned max_snapshots;          /* 0: SNAPFG_DEFAULT_MAX_SNAPSHOTS */
  bool writeback;                  /* writeback=on */
  uint64_t writeback_max;          /* 0: snapfg_default_writeback_max ();
                                      either lowered to fit the memory
                                      cgroup (writeback_max_for_memory) */
  bool origin_moved;               /* origin-moved=true: stores and bitmaps
                                      bound to another disk of the
                                      origin's size are rebound to it */
  const char *held_dir;            /* held-dir=, or NULL: the default */
  bool held_dir_on_disk;           /* held-dir-on-disk=true */
};

/* writeback-max= default: a sixteenth of the machine's memory, at
 * least 64M and at most 1G (see nbdkit-snapfg-plugin(1)).
 */
extern uint64_t snapfg_default_writeback_max (void);

/* Replay what a held file left by an unclean stop holds (the writes
 * write-back had acknowledged and not applied), before any client is
 * served: after the snapshots of the catalogue and the command line are
 * attached.  Nothing to do: 0.  Returns 0 or -1 with the refusal logged
 * (the server must not start: the file names itself and what to do).
 */
extern int snapfg_engine_replay_held (struct snapfg_engine *e);

/* Write-back of first writes (writeback=), for stats. */
struct snapfg_writeback_stats {
  bool enabled;
  uint64_t max_bytes;              /* writeback-max= */
  uint64_t held_bytes;             /* held now (as writeback-max counts) */
  uint64_t held_writes;
  uint64_t rounds;                 /* commit rounds done */
  uint64_t round_exceptions;       /* exceptions committed in them */
  uint64_t max_round;              /* the most in one round */
  uint64_t waiting;                /* writers waiting for room now */
  uint64_t room_waits;             /* writers that waited, in all */
  uint64_t origin_errors;          /* held writes the origin refused */
  uint64_t errors_unseen;          /* of those, not yet reported to any
                                      client's flush or FUA request */
};
extern void snapfg_writeback_stats (struct snapfg_engine *e,
                                    struct snapfg_writeback_stats *ws);
/* Origin writes that failed after write-back acknowledged them, so far
 * (snapfg_writeback_errors).  An error sequence, as the kernel's errseq,
 * in held writes' sequence numbers (writeback-errors.c): a connection
 * keeps *told, the point up to which it has been told of every failure,
 * starting at snapfg_writeback_errors_sample (the point up to which
 * they were reported to anyone, so that an error nobody has heard of yet
 * is reported to it).  A flush or FUA request loads *told when it begins
 * (atomically: the connection's requests run in parallel) and, once it
 * has succeeded, asks snapfg_writeback_check with that value: -EIO if a
 * failure is past it, and the connection has then been told of every
 * failure so far.  So every request in flight when a failure became
 * known reports it, the connection's later ones do not.  _unseen:
 * failures no client has heard of yet.
 */
extern uint64_t snapfg_writeback_errors (struct snapfg_engine *e);
extern uint64_t snapfg_writeback_errors_sample (struct snapfg_engine *e);
extern uint64_t snapfg_writeback_errors_unseen (struct snapfg_engine *e);
extern int snapfg_writeback_check (struct snapfg_engine *e, uint64_t *told,
                                   uint64_t told_at_start);

/* Who attaches a snapshot's store (docs/design.md section 7): this decides
 * which existing stores may be attached as valid.
 */
enum snapfg_attach {
  SNAPFG_ATTACH_RUNTIME = 0,       /* create at run time: a new snapshot,
                                      so a new, empty or all-zero COW */
  SNAPFG_ATTACH_STARTUP,           /* cow= / snapshot= on the command line */
  SNAPFG_ATTACH_RESTORE,           /* the catalogue's, at restart */
};

struct snapfg_snapshot_options {
  const char *name;                /* export name */
  const char *cow_path;            /* NULL: STATE.d/NAME.cow (needs state=) */
  const char *store_type;          /* store-types.h; NULL: the default */
  uint64_t chunk_size;             /* power of two, 512 .. 1M (checked by
                                      snapfg_snapshot_create); 0: default */
  uint64_t cow_size;               /* 0: default */
  enum snapfg_attach attach;
  /* SNAPFG_ATTACH_RESTORE: the catalogue's record. */
  const char *uuid;
  bool merging;                    /* the catalogue says a merge is under way */
  bool owned;                      /* the COW is in the state directory */
  int64_t created;
  const char *checkpoint;          /* also start this checkpoint at the
                                      snapshot's instant (checkpoint.h) */
  const char *checkpoint_owner;    /* who made it (snapfg-backup: its
                                      HOST:DIR), shown by checkpoint list */
  bool temporary;                  /* for one run of a tool (snapfg-backup):
                                      recorded so, and dropped at the next
                                      start instead of brought back */
};

struct catalogue;

/* Keep the engine's snapshots in this catalogue (state=): from now on
 * every create, drop and merge is recorded in it.  The engine does not
 * own it (the caller closes it after the engine).
 */
extern void snapfg_engine_set_catalogue (struct snapfg_engine *e,
                                         struct catalogue *cat);
/* Bring back the catalogue's snapshots (start-up, before any client):
 * persistent ones under their names, an interrupted merge (resumed by
 * snapfg_engine_start_background), transient ones recorded as lost.
 */
extern int snapfg_engine_restore (struct snapfg_engine *e);

/* Checks shared by the plugin's parameter parsing and snapfgctl.  They
 * return NULL if the value is fine, else a message saying what is wrong.
 */
extern const char *snapfg_check_store_type (const char *store_type);
extern const char *snapfg_check_block_size (int64_t block_size);

/* Open the origin.  Logs an error naming the file on failure. */
extern int snapfg_engine_open (const struct snapfg_options *opts,
                               struct snapfg_engine **ep);
/* Start background work (a merge interrupted by a restart).  Call once
 * the process will not fork any more.
 */
extern int snapfg_engine_start_background (struct snapfg_engine *e);
/* Close everything, cleanly (stores are told the shutdown was clean). */
extern void snapfg_engine_close (struct snapfg_engine *e);

/* Take a snapshot of the origin now and add it to the engine.  In-flight
 * origin writes complete first; later ones copy out into it.
 */
extern int snapfg_snapshot_create (struct snapfg_engine *e,
                                   const struct snapfg_snapshot_options *o);

/* Find a snapshot by export name and take a reference to it (NULL if
 * none).  The reference keeps it alive after a drop; put it when done.
 */
extern struct snapfg_snapshot *snapfg_snapshot_get (struct snapfg_engine *e,
                                                    const char *name);
/* The i-th snapshot in creation order, referenced (NULL past the end). */
extern struct snapfg_snapshot *snapfg_snapshot_get_nth (struct snapfg_engine *e,
                                                        size_t i);
extern void snapfg_snapshot_put (struct snapfg_snapshot *s);
extern const char *snapfg_snapshot_name (const struct snapfg_snapshot *s);
/* Is its COW store the state directory's own (created by a create
 * without a COW path), so that a drop or merge removes it?
 */
extern bool snapfg_snapshot_cow_owned (const struct snapfg_snapshot *s);

/* Remove a snapshot: it disappears from the exports, its connections get
 * EIO, origin writes stop copying out into it; its COW file is left as
 * it is.  In-flight requests finish first.
 */
extern int snapfg_snapshot_drop (struct snapfg_engine *e, const char *name);

/* Change the advertised block size (512 or 4096) for new connections,
 * after in-flight requests finish.
 */
extern int snapfg_set_block_size (struct snapfg_engine *e,
                                  uint32_t block_size);

/* The origin ranges written since the snapshot was taken (its remapped
 * chunks, merged into extents), in order.  Refused (logged, -EIO or
 * -EBUSY) for an Invalid or merging snapshot, whose list would be
 * incomplete.
 */
typedef int (*snapfg_range_fn) (void *opaque, uint64_t offset,
                                uint64_t length);
extern int snapfg_snapshot_changed (struct snapfg_snapshot *s,
                                    snapfg_range_fn fn, void *opaque);

/* A connection to a view (s == NULL: the origin) opened (+1) or closed. */
extern void snapfg_view_connection (struct snapfg_engine *e,
                                    struct snapfg_snapshot *s, int delta);

struct snapfg_view_stats {
  struct stats_summary requests;   /* counters, latency, connections */
  uint64_t exceptions;             /* completed exceptions (snapshots) */
  uint64_t lock_contention;        /* stripe lock acquisitions that waited */
};
extern void snapfg_view_stats (struct snapfg_engine *e,
                               struct snapfg_snapshot *s,
                               struct snapfg_view_stats *vs);

struct snapfg_snapshot_info {
  const char *name;
  const char *store;               /* its type's name (store-types.h) */
  const char *cow_path;
  uint32_t chunk_size;
  const char *state;               /* "valid", "Invalid", "Overflow",
                                      "merging" */
  char status[96];                 /* the dm status line */
  uint64_t exceptions;
  int connections;
  uint64_t merge_done, merge_total;  /* chunks; total 0: not merging */
  /* The COW store's usage in 512-byte sectors, as in the dm status line
   * (also when that line says Invalid or Overflow).
   */
  uint64_t allocated_sectors, total_sectors, metadata_sectors;
};

/* Start merging a persistent snapshot back into the origin in the
 * background (dm's snapshot-merge): the origin view becomes the
 * snapshot's view at once, the chunks are copied back, and the snapshot
 * is gone when done.  A restart midway resumes.
 */
extern int snapfg_snapshot_merge (struct snapfg_engine *e, const char *name);
extern void snapfg_snapshot_info (struct snapfg_snapshot *s,
                                  struct snapfg_snapshot_info *info);

/* Geometry. */
extern uint64_t snapfg_size (struct snapfg_engine *e);
extern uint32_t snapfg_block_size (struct snapfg_engine *e);
/* The preferred I/O size of a view: the chunk size (of the snapshot, or
 * the smallest of all snapshots for the origin), at least the block size.
 */
extern uint32_t snapfg_preferred_size (struct snapfg_engine *e,
                                       struct snapfg_snapshot *s);
extern const char *snapfg_origin_path (struct snapfg_engine *e);
/* The origin's identity (device_identity); false if it has none. */
extern bool snapfg_origin_identity (struct snapfg_engine *e,
                                    struct device_identity *id);

/* The dm-style status line of a snapshot: "Invalid", "Overflow", or
 * "<allocated sectors>/<total sectors> <metadata sectors>".
 */
extern void snapfg_snapshot_status (struct snapfg_snapshot *s,
                                    char *buf, size_t len);
/* "<store type>, chunk <size>, COW <path>". */
extern void snapfg_snapshot_describe (struct snapfg_snapshot *s,
                                      char *buf, size_t len);

/* Holding new origin writes (the control socket's suspend and resume,
 * src/engine/suspend.c).  A suspend waits for the origin changes in
 * flight; from then on every new origin write, zero or trim waits (it
 * does not fail) until snapfg_resume or until the timeout, when the
 * engine resumes by itself and logs it.  Snapshots can be created
 * meanwhile: their instant is the suspend's.  Reads and snapshot views
 * are not held.
 */
#define SNAPFG_SUSPEND_DEFAULT_TIMEOUT_MS 10000
#define SNAPFG_SUSPEND_MIN_TIMEOUT_MS 100
#define SNAPFG_SUSPEND_MAX_TIMEOUT_MS 300000

/* -EBUSY if already suspended (the caller that suspended resumes it);
 * -EINVAL for a timeout out of bounds.  *id numbers the suspend.
 */
extern int snapfg_suspend (struct snapfg_engine *e, uint64_t timeout_ms,
                           uint64_t *id);

struct snapfg_suspend_info {
  bool suspended;                  /* now */
  uint64_t id;                     /* the current or last suspend (0: none) */
  uint64_t timeout_ms;             /* its timeout */
  uint64_t held_ms;                /* how long it held (so far, if current) */
  uint64_t remaining_ms;           /* until it ends by itself (if current) */
  bool timed_out;                  /* the last one ended by its timeout */
  unsigned waiting;                /* origin writes waiting now */
  uint64_t count;                  /* suspends, in all */
  uint64_t timeouts;               /* of them ended by their timeout */
  uint64_t held_writes;            /* origin writes that waited, in all */
  uint64_t held_ms_total;          /* time suspended, in all */
};

/* End the suspend now.  *info (may be NULL) describes it as it was
 * before: info->suspended false means there was none to end, and
 * info->timed_out says whether the last one ended by its timeout.
 */
extern void snapfg_resume (struct snapfg_engine *e,
                           struct snapfg_suspend_info *info);
extern void snapfg_suspend_info (struct snapfg_engine *e,
                                 struct snapfg_suspend_info *info);

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
 * and metadata of every snapshot, then the origin).  'from' is the view
 * asking (NULL: the origin); like every request on an Invalid or dropped
 * snapshot, a flush there fails with EIO.
 */
extern int snapfg_flush (struct snapfg_engine *e,
                         struct snapfg_snapshot *from);

#endif
