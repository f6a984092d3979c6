/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: what a chunk size may be (one rule for chunk-size=, the control
 * socket's create and the catalogue's records).
 */

#ifndef SNAPFG_CHUNK_SIZE_H
#define SNAPFG_CHUNK_SIZE_H

#include <stdint.h>

#define SNAPFG_MIN_CHUNK_SIZE 512
#define SNAPFG_MAX_CHUNK_SIZE (1024 * 1024)

/* NULL if chunk_size is a valid chunk size, else what is wrong with it. */
extern const char *snapfg_check_chunk_size (int64_t chunk_size);

#endif
