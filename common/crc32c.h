/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: CRC-32C (Castagnoli), the checksum of write-back's held file.
 *
 * CRC-32C because x86-64 computes it in hardware (SSE4.2's crc32
 * instruction, used when the CPU has it), so checksumming a held write's
 * data costs a fraction of copying it; the table version gives the same
 * values anywhere else.  Not the IEEE CRC-32 of the store binding's
 * record (store-binding.c): that one is part of an existing on-disk
 * format over a few bytes.
 */
#ifndef SNAPFG_CRC32C_H
#define SNAPFG_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continue crc (0 to start) over len bytes of buf. */
extern uint32_t crc32c (uint32_t crc, const void *buf, size_t len);

#endif
