/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: what a chunk size may be (one rule for chunk-size=, the control
 * socket's create and the catalogue's records), and what a checkpoint's
 * granularity may be, which is a multiple of the chunk size (one rule
 * for cbt-granularity=, the catalogue's records and the bitmaps).
 */

#ifndef SNAPFG_CHUNK_SIZE_H
#define SNAPFG_CHUNK_SIZE_H

#include <stdint.h>

#define SNAPFG_MIN_CHUNK_SIZE 512
#define SNAPFG_MAX_CHUNK_SIZE (1024 * 1024)

/* NULL if chunk_size is a valid chunk size, else what is wrong with it. */
extern const char *snapfg_check_chunk_size (int64_t chunk_size);

#define CBT_DEFAULT_GRANULARITY (64 * 1024)
#define CBT_MAX_GRANULARITY (1u << 30)

/* NULL if granularity is fine for chunk size chunk_size (0: any), else a
 * message saying what is wrong.
 */
extern const char *cbt_check_granularity (int64_t granularity,
                                          int64_t chunk_size);

#endif
