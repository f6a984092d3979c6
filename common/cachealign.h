/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: cache-line size used to pad per-CPU slots and lock stripes so that
 * two CPUs working on unrelated data never write to the same line.
 */
#ifndef SNAPFG_CACHEALIGN_H
#define SNAPFG_CACHEALIGN_H

#define SNAPFG_CACHELINE 64
#define SNAPFG_CACHE_ALIGNED __attribute__ ((aligned (SNAPFG_CACHELINE)))

#endif
