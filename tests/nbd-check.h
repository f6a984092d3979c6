/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* nbd-check: the libnbd client driver of the integration tests.
 *
 * One program, one subcommand per kind of check, each in its own file:
 *
 *   nbd-check.c              the command line: which subcommand runs
 *   nbd-check-common.c       messages, numbers, files, random data,
 *                            connections, comparing data with a model,
 *                            extents, export descriptions, options
 *   nbd-check-semantics.c    semantics: random I/O against a model
 *   nbd-check-concurrency.c  concurrency: threads racing on both views
 *   nbd-check-failure.c      failure: Invalid and Overflow
 *
 * Plain reads, writes, size and export listing are left to the standard
 * tools (nbdinfo, nbdsh, nbdcopy + cmp).
 */
#ifndef NBD_CHECK_H
#define NBD_CHECK_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libnbd.h>

/* The largest request sent at once (less if the server says so). */
#define MAX_REQUEST (1024 * 1024)

extern bool verbose;

/* --- messages and failure --- */

extern void note (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));
/* Print "nbd-check: FAIL: " and the message (no newline): the one
 * prefix of fail, nbd_fail and the failure tests' deferred failures.
 */
extern void vreport_failure (const char *fmt, va_list ap)
  __attribute__ ((format (printf, 1, 0)));
/* Print "FAIL: ...", close the main thread's connections, exit 1. */
extern void fail (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2), noreturn));
/* Like fail, appending the libnbd error of the last call. */
extern void nbd_fail (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2), noreturn));
extern const char *errno_name (int e);

/* --- numbers, files, random data --- */

/* A number with an optional k/M/G suffix; exit 2 if it is not one. */
extern uint64_t parse_u64 (const char *what, const char *s);
extern uint8_t *load_file (const char *path, uint64_t *sizep);
extern void save_file (const char *path, const uint8_t *buf, uint64_t size);
extern void *xmalloc (size_t n);

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

extern void rnd_fill (uint64_t *s, uint8_t *buf, size_t len);
extern uint64_t seed_init (uint64_t seed);

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

extern double now_s (void);

/* --- connections and data --- */

/* Connect to uri (exit 1 if that fails).  strict_align false lets
 * requests not aligned to the minimum block size through.  A registered
 * handle is shut down cleanly if the program fails.
 */
extern struct nbd_handle *do_connect (const char *uri, bool strict_align,
                                      bool register_handle);
extern void do_disconnect (struct nbd_handle *h);
extern uint64_t max_request (struct nbd_handle *h);
/* Read or write [off, off+len) in pieces of at most piece bytes. */
extern int read_range (struct nbd_handle *h, uint8_t *buf, uint64_t off,
                       uint64_t len, uint64_t piece);
extern int write_range (struct nbd_handle *h, const uint8_t *buf,
                        uint64_t off, uint64_t len, uint64_t piece,
                        uint32_t flags);
/* Compare actual with expected for [off, off+len); on a mismatch say
 * where and how many bytes came from 'other' (optional).
 */
extern bool compare_bufs (const char *label, const uint8_t *expected,
                          const uint8_t *actual, const uint8_t *other,
                          const char *other_name, uint64_t off, uint64_t len);
/* Read a range and compare it with model + off; fail on a mismatch. */
extern void check_range (struct nbd_handle *h, const char *label,
                         const uint8_t *model, const uint8_t *other,
                         const char *other_name, uint64_t off, uint64_t len,
                         uint64_t piece);

/* --- export descriptions (NBD_OPT_LIST) --- */

/* The description of export 'name' (malloc'd), or NULL if not listed. */
extern char *export_description (const char *uri, const char *name);
/* The snapshot's description must contain word (its dm status). */
extern void expect_status (const char *uri, const char *word);

/* --- extents --- */

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

extern int extent_cb (void *opaque, const char *metacontext,
                      uint64_t offset, uint32_t *entries, size_t nr_entries,
                      int *error);
/* Every extent of [0, size); checks that they tile it. */
extern struct ext_ctx collect_extents (struct nbd_handle *h,
                                       const char *label, uint64_t size);
/* Every extent flagged ZERO must read as zeroes in the model. */
extern void check_zero_extents (const char *label, const struct ext_ctx *c,
                                const uint8_t *model);

/* --- options of semantics, concurrency and failure --- */

struct opts {
  uint64_t chunk, min, pref, ops, seed, region, snap_writers;
  uint64_t cow_chunks, min_held;
  bool aligned, have_min, have_pref, have_min_held;
  const char *expect_origin, *expect_snapshot;
};

/* Parse the options; returns the index of the first operand. */
extern int parse_opts (int argc, char **argv, struct opts *o);

/* --- the subcommands --- */

extern int cmd_semantics (int argc, char **argv);
extern int cmd_concurrency (int argc, char **argv);
extern int cmd_failure (int argc, char **argv);

#endif
