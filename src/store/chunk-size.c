/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: the chunk size rule (chunk-size.h). */

#include <config.h>

#include <stddef.h>

#include "chunk-size.h"
#include "power-of-two.h"

const char *
snapfg_check_chunk_size (int64_t chunk_size)
{
  if (chunk_size < SNAPFG_MIN_CHUNK_SIZE || chunk_size > SNAPFG_MAX_CHUNK_SIZE)
    return "must be between 512 and 1M";
  if (!is_power_of_two (chunk_size))
    return "must be a power of two";
  return NULL;
}

const char *
cbt_check_granularity (int64_t granularity, int64_t chunk_size)
{
  if (granularity <= 0 || !is_power_of_two (granularity))
    return "must be a power of two";
  if (granularity < chunk_size)
    return "must be at least chunk-size= (the copy-out unit)";
  if (granularity > CBT_MAX_GRANULARITY)
    return "must be at most 1G";
  return NULL;
}
