/* SPDX-License-Identifier: BSD-3-Clause */
/* Copyright (C) 2026 the snapfg authors */
/* snapfg: buffers of whole chunks (megabytes), allocated once and kept.
 *
 * Memory the process has not touched yet costs a page fault per 4 KiB
 * page at first use, and on a VM whose balloon hands free pages back to
 * the host each of those faults traps to the host: a full backup of a
 * 512 MiB disk took 22,000 of them, a fifth of its CPU samples.  A big
 * buffer is mapped on its own, 2 MiB aligned and marked for transparent
 * huge pages (where the kernel allows them only on request), so that it
 * faults in 2 MiB at a time; without huge pages it is an ordinary
 * mapping.  Keep such buffers for the whole job: malloc/free of a chunk
 * each time hands the memory back to the kernel and faults it in again.
 */
#ifndef SNAPFG_BIG_BUFFER_H
#define SNAPFG_BIG_BUFFER_H

#include <stddef.h>

/* len bytes (zeroed, as new memory is), or NULL with errno set. */
extern void *big_alloc (size_t len);

/* Free what big_alloc (len) returned; NULL is ignored. */
extern void big_free (void *p, size_t len);

#endif
